#include "core/identity.h"

#include <unistd.h>

#include <cstdlib>

#include "core/json_text.h"
#include "core/runtime.h"

namespace shunt::telemetry {

namespace {
// Labels and JSON strings are UTF-8; the environment's bytes need not be.
std::string first_env(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const char* v = getenv(n); v && *v) return valid_utf8(v);
  return "";
}
}  // namespace

std::string job_id() {
  const std::string& j = config().str(Param::job_id);
  if (!j.empty()) return valid_utf8(j);
  return first_env({"SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "PBS_JOBID"});
}

std::string rank() { return first_env({"RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}); }

std::string host_name() {
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  return valid_utf8(host);
}

}  // namespace shunt::telemetry
