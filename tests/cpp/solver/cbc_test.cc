#include "solver/cbc.h"

#include <gtest/gtest.h>

namespace tp::solver {
namespace {

TEST(CbcTest, SolvesKnapsack) {
  // max 10a + 13b + 7c  s.t. 4a + 6b + 3c <= 9, binary -> a + c (value 17, weight 7).
  IlpModel m;
  m.SetMaximize(true);
  int a = m.AddBinary(10, "a");
  int b = m.AddBinary(13, "b");
  int c = m.AddBinary(7, "c");
  m.AddConstraint({{a, 4}, {b, 6}, {c, 3}}, Sense::kLessEqual, 9, "weight");
  IlpSolution s = m.Solve();
  ASSERT_EQ(s.status, IlpStatus::kOptimal);
  EXPECT_NEAR(s.objective, 20.0, 1e-6);  // b + c = 13 + 7 with weight 9
  EXPECT_EQ(s.IntValue(a), 0);
  EXPECT_EQ(s.IntValue(b), 1);
  EXPECT_EQ(s.IntValue(c), 1);
}

TEST(CbcTest, OneStrategyPerNodeAssignment) {
  // The shape of the sharding ILP: pick exactly one strategy per node, minimise cost plus an
  // edge penalty linearised with an auxiliary variable y >= x0_s + x1_t - 1.
  IlpModel m;
  int x00 = m.AddBinary(1.0), x01 = m.AddBinary(3.0);
  int x10 = m.AddBinary(4.0), x11 = m.AddBinary(1.0);
  m.AddConstraint({{x00, 1}, {x01, 1}}, Sense::kEqual, 1);
  m.AddConstraint({{x10, 1}, {x11, 1}}, Sense::kEqual, 1);
  int y = m.AddVariable(0, 1, 10.0, false, "resharding");  // cost when node0=s0 and node1=s1
  m.AddConstraint({{y, 1}, {x00, -1}, {x11, -1}}, Sense::kGreaterEqual, -1);
  IlpSolution s = m.Solve();
  ASSERT_EQ(s.status, IlpStatus::kOptimal);
  // Options: (0,0)=5, (0,1)=1+1+10=12, (1,0)=7, (1,1)=4.
  EXPECT_NEAR(s.objective, 4.0, 1e-6);
  EXPECT_EQ(s.IntValue(x01), 1);
  EXPECT_EQ(s.IntValue(x11), 1);
}

TEST(CbcTest, ReportsInfeasible) {
  IlpModel m;
  int x = m.AddVariable(0, 10, 1, true);
  m.AddConstraint({{x, 1}}, Sense::kGreaterEqual, 5);
  m.AddConstraint({{x, 1}}, Sense::kLessEqual, 3);
  IlpSolution s = m.Solve();
  EXPECT_EQ(s.status, IlpStatus::kInfeasible);
  EXPECT_FALSE(s.has_solution());
}

TEST(CbcTest, RejectsBadInput) {
  IlpModel m;
  EXPECT_THROW(m.AddVariable(2, 1, 0, false), std::invalid_argument);
  EXPECT_THROW(m.AddConstraint({{5, 1.0}}, Sense::kEqual, 0), std::out_of_range);
}

TEST(CbcTest, BufferedModelLoadsOnceAndTakesAdditionsAfter) {
  // Variables and rows are buffered until the model is needed: objective changes before that
  // land in the buffer, a clone loads it, and rows added to the clone go to CBC directly.
  IlpModel m;
  int a = m.AddBinary(5.0, "a");
  int b = m.AddBinary(3.0, "b");
  m.AddConstraint({{a, 1}, {b, 1}}, Sense::kGreaterEqual, 1, "one");
  m.SetObjective(a, 2.0);  // now a (2) is cheaper than b (3)
  EXPECT_EQ(m.ObjectiveCoefficients(), (std::vector<double>{2.0, 3.0}));
  IlpModel copy = m.Clone();
  int c = copy.AddBinary(1.0, "c");
  copy.AddConstraint({{a, 1}}, Sense::kEqual, 0, "no_a");
  copy.AddConstraint({{b, 1}, {c, 1}}, Sense::kGreaterEqual, 1, "b_or_c");
  IlpSolution s = m.Solve();
  ASSERT_EQ(s.status, IlpStatus::kOptimal);
  EXPECT_NEAR(s.objective, 2.0, 1e-6);
  EXPECT_EQ(s.IntValue(a), 1);
  IlpSolution t = copy.Solve();
  ASSERT_EQ(t.status, IlpStatus::kOptimal);
  EXPECT_EQ(t.IntValue(a), 0);
  EXPECT_EQ(t.IntValue(b), 1);  // b covers both rows: 3 < b + c = 4
  EXPECT_NEAR(t.objective, 3.0, 1e-6);
}

}  // namespace
}  // namespace tp::solver
