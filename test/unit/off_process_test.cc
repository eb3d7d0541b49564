// A process where shunt turned itself off is seen by the operator: its
// report says mode off and why, and the metrics count it by mode.
#include <gtest/gtest.h>
#include <unistd.h>

#include "telemetry/metrics.h"
#include "telemetry/off_report.h"

namespace shunt::telemetry {
namespace {
using nlohmann::json;

TEST(OffProcess, ReportSaysModeOffAndWhy) {
  json snap = off_snapshot("SHUNT_MODE='fats' is not a known value");
  EXPECT_EQ(snap["mode"], "off");
  EXPECT_EQ(snap["off_reason"], "SHUNT_MODE='fats' is not a known value");
  EXPECT_EQ(snap["pid"], getpid());
}

TEST(OffProcess, MetricsCountEveryProcessByMode) {
  HostView v;
  v.members["200"] = off_snapshot("SHUNT_MODE='fats' is not a known value");
  v.members["200"]["job"] = "j";
  v.members["200"]["rank"] = "3";
  v.members["201"] = {{"mode", "active"}, {"job", "j"}, {"rank", "4"}};
  std::string t = render_metrics(v);
  EXPECT_NE(t.find("\nshunt_process_mode{shunt_job=\"j\",rank=\"3\",mode=\"off\"} 1\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("\nshunt_process_mode{shunt_job=\"j\",rank=\"4\",mode=\"active\"} 1\n"),
            std::string::npos);
}

}  // namespace
}  // namespace shunt::telemetry
