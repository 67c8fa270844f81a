// Runs every tests/scenarios/*.scn file as one test case.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "scenario.h"

namespace tf::sched {
namespace {

std::vector<std::string> ScenarioFiles() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(TF_SCENARIO_DIR)) {
    if (e.path().extension() == ".scn") out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

class ScenarioTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ScenarioTest, Passes) {
  std::ifstream in(std::string(TF_SCENARIO_DIR) + "/" + GetParam());
  std::stringstream text;
  text << in.rdbuf();
  Status s = RunScenario(text.str());
  EXPECT_TRUE(s.ok()) << GetParam() << ": " << s.ToString();
}

INSTANTIATE_TEST_SUITE_P(Files, ScenarioTest, ::testing::ValuesIn(ScenarioFiles()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param.substr(0, info.param.size() - 4);
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

TEST(ScenarioInterpreterTest, ReportsTheFailingLine) {
  Status s = RunScenario("pool add p\nnode add n gpus=1 model=A100\nsubmit a tflops=10 vram=10\nexpect pending a\n");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("line 4"), std::string::npos) << s.message();
  EXPECT_FALSE(RunScenario("bogus command\n").ok());
}

}  // namespace
}  // namespace tf::sched
