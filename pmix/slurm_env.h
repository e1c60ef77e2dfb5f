/*
 * slurm_env.h: the slurm:// init method without PMIx (srun --mpi=none):
 * rank, sizes and the store address derived from the variables srun sets
 * in every task. Rank 0 hosts the store on the first node of the step, at
 * a port both sides compute alike. Also detection of PBS (documented only:
 * under PBS use PMIx through mpirun, or env://).
 */
#ifndef DCOMM_SLURM_ENV_H
#define DCOMM_SLURM_ENV_H

#include <stddef.h>

/* 1 when SLURM_PROCID is set (a task started by srun), else 0. */
int dcomm__slurm_detect(void);

/* Fills the job's facts:
 *   rank        SLURM_PROCID
 *   size        SLURM_NTASKS (older: SLURM_NPROCS)
 *   local_rank  SLURM_LOCALID
 *   local_size  SLURM_NTASKS_PER_NODE, else the entry of SLURM_NODEID (0
 *               when unset) in SLURM_STEP_TASKS_PER_NODE or
 *               SLURM_TASKS_PER_NODE ("4(x2),3": 4, 4, 3)
 *   host        first host of SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST
 *               (older: SLURM_NODELIST), where task 0 runs
 *   port        DCOMM_STORE_PORT when set, else
 *               20000 + (SLURM_JOB_ID * 31 + SLURM_STEP_ID) % 20000
 * Missing or contradictory values: DCOMM_EINVAL naming the variable. */
int dcomm__slurm_spec(int *rank, int *size, int *local_rank, int *local_size, char *host, size_t hl, int *port);

/* 1 when PBS_JOBID is set, else 0. */
int dcomm__pbs_detect(void);

#endif
