// The kvserve binary on bad input: exit code 1 and one line saying what is wrong.
#include <gtest/gtest.h>

#include <algorithm>

#include "test_util.h"

using ::kvserve::test_util::run_kvserve;
using ::kvserve::test_util::TempFile;

namespace {

void expect_one_line_error(const std::string& args, const std::string& needle) {
  const auto r = run_kvserve(args);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
}

}  // namespace

TEST(Cli, RunOnAMissingModelFails) {
  expect_one_line_error("run -m /nonexistent/model.gguf -n 1", "/nonexistent/model.gguf: cannot open");
}

TEST(Cli, RunOnACorruptModelFails) {
  TempFile f(".gguf");
  f.write({'G', 'G', 'U', 'F', 3, 0, 0, 0, 1, 2});
  expect_one_line_error("run -m " + f.path() + " -n 1", f.path() + ": unexpected end of file while reading tensor_count");
  TempFile g(".gguf");
  g.write({'n', 'o', 't', ' ', 'a', ' ', 'm', 'o', 'd', 'e', 'l'});
  expect_one_line_error("info " + g.path(), "bad magic");
}

TEST(Cli, RunRejectsBadFlags) {
  expect_one_line_error("run -m /nonexistent.gguf --top-p 3", "top_p");
}
