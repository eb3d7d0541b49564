// Busy time of the application's QPs: how long each had a signaled send WR
// outstanding. The hot path only counts signaled sends and send
// completions (stats.h); a sampler on the agent thread looks at every QP a
// few dozen times a second and credits the time since its last look to the
// QPs that have work out now. Sampled at random instants, the busy share is
// unbiased however the job's steps fall; bytes over busy time is then the
// rate a peer pair achieves while it has work to do, which a slow link or
// host lowers and a job that merely waits does not (telemetry/diagnose.h).
#pragma once
#include <cstdint>

#include <infiniband/verbs.h>

namespace shunt::verbs {

struct QpRecord;

// After a successful modify that set the address vector (RTR): the two
// ends' addresses, from the destination GID and the port's source GID.
void note_addresses(QpRecord* r, const ibv_qp_attr* attr, int mask);

// One look at every QP at time now_ms (monotonic); returns how many had
// work out. Whether any had is the process's step rhythm's look too
// (telemetry/rhythm.h). The caller picks the next instant (busy_next_ms).
int sample_busy(int64_t now_ms);

// How many times the process's QPs all went idle after some had work: the
// ends of its steps' communication. At each, the QPs that had work at the
// look before count one in their last_steps (registry.h).
uint64_t step_ends();

// When to look next: soon (every ~20 ms, jittered) until 10 s after a look
// found a QP that moved or had work out, else after idle_ms.
int64_t busy_next_ms(int64_t now_ms, int busy_qps, int64_t idle_ms);

}  // namespace shunt::verbs
