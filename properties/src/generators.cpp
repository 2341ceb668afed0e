#include "attncheck/law.hpp"
