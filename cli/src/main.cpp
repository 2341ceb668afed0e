// attncheck: property-based verification of scaled causal attention. Subcommands are added per feature.
#include <CLI/CLI.hpp>
#include <iostream>

#include "demo.hpp"

int main(int argc, char** argv) {
  CLI::App app{"attncheck: checks the laws of scaled causal attention"};
  app.require_subcommand(1);
  auto* demo = app.add_subcommand("demo", "walk through the source card's T=3, d=2 example and its invariants");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return e.get_exit_code() == 0 ? app.exit(e) : (app.exit(e), 2);
  }
  try {
    if (*demo) return attncheck::cli::run_demo(std::cout);
  } catch (const std::exception& e) {
    std::cerr << "attncheck: internal error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
