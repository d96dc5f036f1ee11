// prepare: the `train_gpt prepare` subcommand (text file -> token shards + tokenizer file).
#pragma once

// Parses its own arguments (argv[0] is "prepare"); returns the process exit code.
int prepare_main(int argc, char **argv);
