// The `.cf` text format: a readable, line-oriented form of the Graph IR that round-trips through
// print_cf / parse_cf (parse(print(g)) prints identically).
#pragma once

#include <string>

#include "comfuse/graph.h"

namespace comfuse {

// A syntax or semantic error in a .cf file: what() is "file:line:col: error: <what was expected>".
class ParseError : public std::runtime_error {
 public:
  ParseError(const std::string& file, int line, int col, const std::string& msg);
  std::string file;
  int line, col;
  std::string message;  // without the location prefix
};

Graph parse_cf(const std::string& text, const std::string& filename = "<input>");
Graph parse_cf_file(const std::string& path);  // reads the file; a missing file is a ParseError at 0:0
std::string print_cf(const Graph& g);

}  // namespace comfuse
