// stop: SIGTERM and SIGINT as a request to stop training cleanly. The first signal only marks
// the request; `train` polls it each step (through trainer_set_stop_poll, so every rank stops
// after the same step), writes a checkpoint and exits with EXIT_STOPPED. A second signal ends the
// process at once, by the signal's default action: checkpoints are written under a temporary
// name and renamed, so the newest complete one stays intact whenever that happens.
#pragma once

void stop_signals_install(void);
// 1 once a stop signal arrived (safe to call from any thread; the trainer's stop poll).
int stop_requested(void);
