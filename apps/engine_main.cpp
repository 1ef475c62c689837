// `engine`: the command line (apps/engine_cli.cpp).
#include "engine_cli.h"

int main(int argc, char** argv) { return engine::cli::run(argc, argv); }
