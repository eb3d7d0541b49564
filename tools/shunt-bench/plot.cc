#include "tools/shunt-bench/plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tools/shunt-bench/net.h"

extern char** environ;

namespace bench {
namespace {

std::string quoted(std::string s) {
  for (char& c : s)
    if (c == '"' || c == '\\') c = '\'';
  return "\"" + s + "\"";
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

}  // namespace

Mark parse_mark(const std::string& s) {
  Mark m;
  size_t colon = s.find(':');
  std::string t = s.substr(0, colon);
  m.label = colon == std::string::npos ? "" : s.substr(colon + 1);
  if (!t.empty() && t[0] == '@') {
    m.absolute = true;
    t = t.substr(1);
  }
  char* end = nullptr;
  m.t = strtod(t.c_str(), &end);
  if (t.empty() || *end) throw BenchError("bad mark '" + s + "' (want SECONDS:LABEL or @EPOCH:LABEL)");
  return m;
}

std::vector<Mark> read_marks_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw BenchError("cannot read marks file " + path);
  std::vector<Mark> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    out.push_back(parse_mark(line));
  }
  return out;
}

void plot_timelines(const std::vector<Series>& series, const std::vector<Mark>& marks, double start_wall,
                    const std::string& title, const std::string& out_file) {
  char dir[] = "/tmp/shunt-bench-plot.XXXXXX";
  if (!mkdtemp(dir)) throw BenchError("mkdtemp: " + errno_text(errno));
  std::string d = dir;
  std::ostringstream gp;
  if (ends_with(out_file, ".svg"))
    gp << "set terminal svg size 1000,450 dynamic background rgb 'white'\n";
  else
    gp << "set terminal pngcairo size 1000,450\n";
  gp << "set output " << quoted(out_file) << "\n"
     << "set title " << quoted(title) << "\n"
     << "set xlabel 'time (s)'\nset ylabel 'throughput (GB/s)'\n"
     << "set grid\nset key top right\nset yrange [0:*]\n";
  int n = 0;
  for (const Mark& m : marks) {
    double t = m.absolute ? m.t - start_wall : m.t;
    gp << "set arrow from " << t << ", graph 0 to " << t << ", graph 1 nohead dt 2 lw 1.5 lc rgb 'red'\n"
       << "set label " << ++n << " " << quoted(m.label) << " at " << t
       << ", graph 0.97 rotate by 90 right offset -0.8,0 tc rgb 'red'\n";
  }
  gp << "plot ";
  for (size_t i = 0; i < series.size(); i++) {
    std::string f = d + "/s" + std::to_string(i) + ".dat";
    std::ofstream out(f);
    for (auto& [t, g] : series[i].points) out << t << " " << g << "\n";
    gp << (i ? ", " : "") << quoted(f) << " using 1:2 with steps lw 2 title " << quoted(series[i].label);
  }
  gp << "\n";
  std::string script = d + "/plot.gp";
  std::ofstream(script) << gp.str();

  pid_t pid;
  const char* argv[] = {"gnuplot", script.c_str(), nullptr};
  int rc = posix_spawnp(&pid, "gnuplot", nullptr, nullptr, const_cast<char* const*>(argv), environ);
  int status = 0;
  if (rc == 0) waitpid(pid, &status, 0);
  for (size_t i = 0; i < series.size(); i++) unlink((d + "/s" + std::to_string(i) + ".dat").c_str());
  unlink(script.c_str());
  rmdir(dir);
  if (rc != 0) throw BenchError("cannot run gnuplot: " + errno_text(rc));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw BenchError("gnuplot failed drawing " + out_file);
}

}  // namespace bench
