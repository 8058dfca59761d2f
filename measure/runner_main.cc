// ktune-runner: the trusted process that hosts variants (see runner.h).
#include "measure/runner.h"

int main(int argc, char** argv) { return ktune::measure::runner_main(argc, argv); }
