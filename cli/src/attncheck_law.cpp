// attncheck-law: runs the laws against a plugin: or exec: implementation (see attncheck/law_main.hpp).
#include "attncheck/law_main.hpp"

int main(int argc, char** argv) { return attncheck::law_main(argc, argv); }
