/*
 * gpupool's SPANK plugin: the job option --gpupool=SPEC (sbatch, salloc, srun).
 *
 * It only carries the request to the node: in the submitting command (local or allocator context) it
 * checks SPEC's form and puts it in the job-control environment, which Slurm hands to the Prolog and
 * Epilog as SPANK_GPUPOOL. The Prolog (deploy/slurm/prolog, `gpupool-slurm prolog`) takes the lease
 * there, before any task starts; the Epilog releases it. Ranges (n, the fraction) are checked by the
 * pool's own rules in the Prolog, so they are written once (server/ranges.py).
 *
 * SPEC: N[xP][:local]   N GPUs, each a partition P of one (default 1); :local = on the job's node
 *                       through its partition (CUDA_VISIBLE_DEVICES + MPS) instead of remote execution.
 * Build: cc -shared -fPIC -o gpupool_spank.so gpupool_spank.c   (needs libslurm-dev's slurm/spank.h)
 * Enable: a line `optional /usr/lib/gpupool/gpupool_spank.so` in plugstack.conf.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/spank.h>

SPANK_PLUGIN(gpupool, 1);

#define SPEC_MAX 64

static char spec[SPEC_MAX + 1];

/* N[xP][:local], N a whole number, P a decimal number: the form only (values are the Prolog's). */
static int spec_form_ok(const char *s)
{
    const char *p = s;
    if (!isdigit((unsigned char)*p))
        return 0;
    while (isdigit((unsigned char)*p))
        p++;
    if (*p == 'x') {
        int digits = 0, dots = 0;
        for (p++; isdigit((unsigned char)*p) || *p == '.'; p++) {
            digits += isdigit((unsigned char)*p) != 0;
            dots += *p == '.';
        }
        if (!digits || dots > 1)
            return 0;
    }
    if (*p == ':')
        return strcmp(p, ":local") == 0;
    return *p == '\0';
}

static int take_option(int val, const char *optarg, int remote)
{
    (void)val;
    (void)remote;
    if (optarg == NULL || strlen(optarg) > SPEC_MAX || !spec_form_ok(optarg)) {
        slurm_error("gpupool: --gpupool=%s is not N[xP][:local] (e.g. --gpupool=1x0.5: one GPU, half of it)",
                    optarg ? optarg : "");
        return -1;
    }
    strcpy(spec, optarg);
    return 0;
}

static struct spank_option gpupool_option = {
    "gpupool", "N[xP][:local]",
    "pooled GPUs for the job's lifetime: N GPUs, each a partition P (default 1) of one; "
    ":local runs on the job's node in its partition instead of remotely (gpupool)",
    1, 0, take_option,
};

/* Registered here rather than through a spank_options table: sbatch and salloc of Slurm 22.05 offer
 * only options registered at init (the table reaches srun alone). */
int slurm_spank_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    return spank_option_register(sp, &gpupool_option) == ESPANK_SUCCESS ? 0 : -1;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    spank_context_t ctx = spank_context();
    if (spec[0] == '\0' || (ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR))
        return 0;
    if (ctx == S_CTX_LOCAL && getenv("SLURM_JOB_ID") != NULL) {
        /* srun inside a job: the job's Prolog has run (or runs for the whole job); a step gets no lease
         * of its own. Said out loud rather than ignored. */
        slurm_error("gpupool: --gpupool=%s on a step of job %s is ignored: a job's lease is taken for the "
                    "whole job (give --gpupool to sbatch/salloc); this step uses the job's lease, if any",
                    spec, getenv("SLURM_JOB_ID"));
        return 0;
    }
    if (spank_job_control_setenv(sp, "GPUPOOL", spec, 1) != ESPANK_SUCCESS) {
        slurm_error("gpupool: could not pass --gpupool=%s to the job's prolog", spec);
        return -1;
    }
    return 0;
}
