/*
 * cli: the subcommands of the `wafer` binary. Each lives in src/cli/cmd_<name>.c, parses its own flags,
 * prints --help, and returns a process exit status (0 ok, 1 runtime failure, 2 usage error).
 */
#ifndef WAFER_CLI_CLI_H
#define WAFER_CLI_CLI_H

int cmd_run_main(int argc, char **argv);
int cmd_info_main(int argc, char **argv);
int cmd_tokenize_main(int argc, char **argv);
int cmd_perplexity_main(int argc, char **argv);
int cmd_model_main(int argc, char **argv);
int cmd_convert_main(int argc, char **argv);
int cmd_quantize_main(int argc, char **argv);
int cmd_bench_main(int argc, char **argv);
int cmd_bench_grammar_main(int argc, char **argv); /* wafer bench grammar (cmd_bench_grammar.c) */
int cmd_serve_main(int argc, char **argv);
int cmd_jobs_main(int argc, char **argv);
int cmd_pull_main(int argc, char **argv);
int cmd_list_main(int argc, char **argv);
int cmd_rm_main(int argc, char **argv);
int cmd_client_main(int argc, char **argv);
int cmd_route_main(int argc, char **argv);
int cmd_alerts_main(int argc, char **argv);
int cmd_ctl_main(int argc, char **argv);

#endif
