// Who this process is in its job, for metric labels and events: the job id
// (SHUNT_JOB_ID or the launcher's) and the rank the launcher gave it.
#pragma once
#include <string>

namespace shunt::telemetry {

// SHUNT_JOB_ID, else SLURM_JOB_ID, TORCHELASTIC_RUN_ID, PBS_JOBID; "" if none.
std::string job_id();
// RANK, OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, SLURM_PROCID; "" if none.
std::string rank();
std::string host_name();

}  // namespace shunt::telemetry
