// cli/prepare: the `train_gpt prepare` subcommand (argv[0] is "prepare"; returns the exit code).
#pragma once

int cli_prepare_main(int argc, char **argv);
