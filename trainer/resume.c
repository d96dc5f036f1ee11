#include "trainer/resume.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "common/check.h"
#include "dist/comm.h"

// One attempt at checkpoint dir on this rank: 0 loaded, -1 it does not load, -2 its model differs
// from c's (a mistake of the user's, not damage: no older checkpoint is tried).
static int try_load(Trainer *t, OptimState *view, const Config *c, const char *dir, TrainState *st,
                    char *err, size_t errlen) {
    Config saved;
    char why[ERR_LEN];
    if (checkpoint_read_config(dir, &saved, err, errlen) != 0) return -1;
    if (config_same_model(c, &saved, why, sizeof why) != 0)
        return set_error(err, errlen, "cannot resume from '%s': %s; use another log.dir or the same "
                                      "model", dir, why), -2;
    return checkpoint_load(dir, trainer_model(t), view, st, err, errlen);
}

int trainer_resume(Trainer *t, const Config *c, const char *run_dir, TrainState *st, char *path,
                   size_t path_len, char *err, size_t errlen) {
    Comm *comm = trainer_comm(t);
    const int rank = comm ? comm->rank : 0;
    char dir[4096], first_err[ERR_LEN] = "";
    int tried = 0;
    long long below = LLONG_MAX, step;
    while ((step = checkpoint_find_before(run_dir, below, dir, sizeof dir)) >= 0) {
        below = step;
        // Every rank makes the same collective calls whatever its own attempt gives: the
        // optimizer views (a gather on CUDA) and one all-reduce of the outcomes.
        OptimState *view = trainer_optim_state(t);
        char why[ERR_LEN] = "";
        const int rc = try_load(t, view, c, dir, st, why, sizeof why);
        double bad[2] = {rc == -1, rc == -2};   // ranks that found damage, a model mismatch
        if (comm) comm->allreduce_host_f64(comm, bad, 2);
        if (bad[1] > 0)
            return set_error(err, errlen, "%s", rc == -2 ? why : "another rank found another model "
                                                                 "in the checkpoint (its log says why)");
        if (bad[0] == 0) {
            trainer_optim_state_commit(t);
            snprintf(path, path_len, "%s", dir);
            return 1;
        }
        // Each rank that found damage says what it found; rank 0 speaks for the others.
        const char *reason = rc == -1 ? why : "another rank could not load its part (its log says why)";
        if (rc == -1 || rank == 0) warnf("%s; trying the checkpoint before it", reason);
        if (!tried++) snprintf(first_err, sizeof first_err, "%s", reason);
    }
    if (!tried) return 0;
    return set_error(err, errlen, "no checkpoint in '%s' loads (the newest: %s): remove the damaged "
                                  "ones or use another log.dir", run_dir, first_err);
}
