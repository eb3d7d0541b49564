#include "clocksync/loop.h"

#include <cmath>
#include <limits>

namespace shunt::clocksync {

namespace {
// Inverts the symmetric positive definite matrix a (m x m, row major) in place
// by Gauss-Jordan with partial pivoting. Returns false if singular.
bool invert(std::vector<double>& a, int m) {
  std::vector<double> inv(size_t(m) * m, 0.0);
  for (int i = 0; i < m; i++) inv[size_t(i) * m + i] = 1;
  for (int c = 0; c < m; c++) {
    int piv = c;
    for (int r = c + 1; r < m; r++)
      if (std::fabs(a[size_t(r) * m + c]) > std::fabs(a[size_t(piv) * m + c])) piv = r;
    double p = a[size_t(piv) * m + c];
    if (std::fabs(p) < 1e-300) return false;
    if (piv != c)
      for (int k = 0; k < m; k++) {
        std::swap(a[size_t(c) * m + k], a[size_t(piv) * m + k]);
        std::swap(inv[size_t(c) * m + k], inv[size_t(piv) * m + k]);
      }
    for (int k = 0; k < m; k++) {
      a[size_t(c) * m + k] /= p;
      inv[size_t(c) * m + k] /= p;
    }
    for (int r = 0; r < m; r++) {
      if (r == c) continue;
      double f = a[size_t(r) * m + c];
      if (f == 0) continue;
      for (int k = 0; k < m; k++) {
        a[size_t(r) * m + k] -= f * a[size_t(c) * m + k];
        inv[size_t(r) * m + k] -= f * inv[size_t(c) * m + k];
      }
    }
  }
  a.swap(inv);
  return true;
}
}  // namespace

bool solve_loops(int n, int root, std::span<const Edge> edges, LoopSolution* out) {
  const double inf = std::numeric_limits<double>::infinity();
  out->offset_ns.assign(n, 0);
  out->bound_ns.assign(n, inf);
  out->chi2 = 0;
  out->dof = 0;
  if (n <= 0 || root < 0 || root >= n) return false;
  out->bound_ns[root] = 0;

  // Hosts reachable from the root; the others cannot be placed.
  std::vector<bool> seen(n, false);
  seen[root] = true;
  for (bool grew = true; grew;) {
    grew = false;
    for (const Edge& e : edges)
      if (e.bound_ns > 0 && seen[e.from] != seen[e.to]) seen[e.from] = seen[e.to] = grew = true;
  }
  std::vector<int> var(n, -1);  // host -> unknown index
  int m = 0;
  for (int i = 0; i < n; i++)
    if (seen[i] && i != root) var[i] = m++;
  if (m == 0) return true;

  // Normal equations L c = r of the weighted least-squares problem.
  std::vector<double> L(size_t(m) * m, 0.0), rhs(m, 0.0);
  int used = 0;
  for (const Edge& e : edges) {
    if (e.bound_ns <= 0 || !seen[e.from] || !seen[e.to] || e.from == e.to) continue;
    used++;
    double w = 1 / (e.bound_ns * e.bound_ns);
    int a = var[e.from], b = var[e.to];
    if (a >= 0) {
      L[size_t(a) * m + a] += w;
      rhs[a] -= w * e.offset_ns;
    }
    if (b >= 0) {
      L[size_t(b) * m + b] += w;
      rhs[b] += w * e.offset_ns;
    }
    if (a >= 0 && b >= 0) {
      L[size_t(a) * m + b] -= w;
      L[size_t(b) * m + a] -= w;
    }
  }
  if (!invert(L, m)) return false;
  for (int i = 0; i < n; i++) {
    if (var[i] < 0) continue;
    double s = 0;
    for (int k = 0; k < m; k++) s += L[size_t(var[i]) * m + k] * rhs[k];
    out->offset_ns[i] = s;
  }
  for (const Edge& e : edges) {
    if (e.bound_ns <= 0 || !seen[e.from] || !seen[e.to] || e.from == e.to) continue;
    double r = (out->offset_ns[e.to] - out->offset_ns[e.from] - e.offset_ns) / e.bound_ns;
    out->chi2 += r * r;
  }
  out->dof = used - m;
  double inflate = out->dof > 0 && out->chi2 > out->dof ? std::sqrt(out->chi2 / out->dof) : 1;
  for (int i = 0; i < n; i++)
    if (var[i] >= 0) out->bound_ns[i] = inflate * std::sqrt(L[size_t(var[i]) * m + var[i]]);
  return true;
}

}  // namespace shunt::clocksync
