// The exposition writer every /metrics endpoint uses, read back by the strict parser the other
// metrics tests use: escaping, exact values, histograms; and the parser refuses what Prometheus
// (or our naming conventions) would not accept.
#include <gtest/gtest.h>

#include <cmath>

#include "common/prometheus_text.h"
#include "exposition_parser.h"

namespace {

using tf::prom::Exposition;
using tf::prom::Type;
using tf::testing::ParsedExposition;
using tf::testing::ParseExposition;

TEST(PrometheusText, LabelValuesAndHelpAreEscapedAndReadBackUnchanged) {
  Exposition e;
  e.Family("tf_x_bytes", Type::kGauge, "Help with a \\ backslash\nand a newline.");
  const std::string odd = "a \"quoted\" \\ name\nwith a newline";
  e.Sample("tf_x_bytes", {{"vgpu", odd}, {"gpu", "GPU-1"}}, 1048576);
  const std::string text = e.Take();
  EXPECT_NE(text.find(R"(vgpu="a \"quoted\" \\ name\nwith a newline")"), std::string::npos) << text;
  ParsedExposition p;
  ASSERT_EQ(ParseExposition(text, &p), "") << text;
  EXPECT_EQ(p.Value("tf_x_bytes", {{"vgpu", odd}}), 1048576);
  EXPECT_EQ(p.families["tf_x_bytes"].help, "Help with a \\\\ backslash\\nand a newline.");
}

TEST(PrometheusText, ValuesAreExact) {
  EXPECT_EQ(tf::prom::FormatValue(989.4), "989.39999999999998");
  EXPECT_EQ(tf::prom::FormatValue(17179869184.0), "17179869184");
  EXPECT_EQ(tf::prom::FormatValue(0.25), "0.25");
  EXPECT_EQ(tf::prom::FormatValue(-INFINITY), "-Inf");
  EXPECT_EQ(tf::prom::FormatValue(NAN), "NaN");
}

TEST(PrometheusText, HistogramsAreCumulativeAndEndAtInf) {
  Exposition e;
  e.Family("tf_wait_seconds", Type::kHistogram, "Waits.");
  e.Histogram("tf_wait_seconds", {{"stage", "a"}}, {0.001, 0.01}, {1, 3}, 0.5, 4);
  ParsedExposition p;
  const std::string text = e.Take();
  ASSERT_EQ(ParseExposition(text, &p), "") << text;
  EXPECT_EQ(p.Value("tf_wait_seconds_bucket", {{"stage", "a"}, {"le", "+Inf"}}), 4);
  EXPECT_EQ(p.Value("tf_wait_seconds_count", {{"stage", "a"}}), 4);
  EXPECT_EQ(p.Value("tf_wait_seconds_sum"), 0.5);
}

TEST(ExpositionParser, RefusesWhatPrometheusOrOurConventionsWouldNot) {
  const struct {
    const char* text;
    const char* why;
  } bad[] = {
      {"# HELP a_total x\n# TYPE a_total counter\na_total 1\n# HELP a_total x\n", "second HELP"},
      {"# HELP g x\n# TYPE g gauge\ng 1\n# HELP h x\n# TYPE h gauge\nh 1\ng{a=\"b\"} 2\n", "appears again"},
      {"# HELP g x\n# TYPE g gauge\ng{a=\"b\\x\"} 1\n", "invalid escape"},
      {"# HELP g x\n# TYPE g gauge\ng{a=\"b} 1\n", "unterminated"},
      {"# HELP g x\n# TYPE g gauge\ng 1\ng 2\n", "repeated series"},
      {"g 1\n", "before the TYPE"},
      {"# HELP c x\n# TYPE c counter\nc 1\n", "does not end in _total"},
      {"# HELP g_total x\n# TYPE g_total gauge\ng_total 1\n", "ends in _total"},
      {"# HELP v_mib x\n# TYPE v_mib gauge\nv_mib 1\n", "base units"},
      {"# HELP u_percent x\n# TYPE u_percent gauge\nu_percent 1\n", "base units"},
      {"# HELP g x\n# TYPE g gauge\ng{size_bytes=\"1\"} 1\n", "carries a unit"},
      {"# HELP g x\n# TYPE g gauge\ng one\n", "bad value"},
      {"# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
       "not cumulative"},
      {"# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n", "not +Inf"},
      {"# HELP h x\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n", "differs from _count"},
      {"# HELP g x\n# TYPE g gauge\ng 1", "newline"},
  };
  for (const auto& b : bad) {
    ParsedExposition p;
    const std::string err = ParseExposition(b.text, &p);
    EXPECT_NE(err.find(b.why), std::string::npos) << "text:\n" << b.text << "\nerror: " << err;
  }
}

}  // namespace
