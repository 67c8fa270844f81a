// What the CLI's tables print of text a node or tenant wrote.
#include <gtest/gtest.h>

#include <string>

#include "controller/cli_commands.h"

namespace {

using tf::controller::PrintableCell;

TEST(PrintableCellTest, EscapeSequencesAndNewlinesCannotReachTheTerminal) {
  EXPECT_EQ(PrintableCell("\x1b[2J\x1b[Hfake prompt$ "), "?[2J?[Hfake prompt$ ");
  EXPECT_EQ(PrintableCell("\x1b]0;owned\x07H100"), "?]0;owned?H100");
  EXPECT_EQ(PrintableCell("a\nb\rc\td\x7f"), "a?b?c?d?");
  EXPECT_EQ(PrintableCell("csi \xc2\x9b" "2J"), "csi ?2J") << "a C1 control in UTF-8";
}

TEST(PrintableCellTest, OrdinaryTextIsKept) {
  EXPECT_EQ(PrintableCell("NVIDIA H100 80GB HBM3"), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(PrintableCell("10.0.0.5:9400"), "10.0.0.5:9400");
  EXPECT_EQ(PrintableCell("caf\xc3\xa9 \xc2\xa0"), "caf\xc3\xa9 \xc2\xa0") << "other UTF-8 is kept";
  EXPECT_EQ(PrintableCell(""), "");
}

}  // namespace
