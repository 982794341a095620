// RAII model builder over CBC's C interface: the project's only way to solve an ILP.
//
// The sharding and placement passes state their problems as variables and linear rows here;
// nothing else in the core knows CBC exists. No solver code of our own.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tp::solver {

enum class Sense { kLessEqual, kGreaterEqual, kEqual };

enum class IlpStatus {
  kOptimal,     // proven optimal
  kFeasible,    // stopped (time limit) with an incumbent solution
  kInfeasible,  // proven infeasible
  kNoSolution,  // stopped before finding any solution
  kUnbounded,
  kError,       // abandoned: numerical difficulties
};
const char* IlpStatusName(IlpStatus status);

struct IlpSolution {
  IlpStatus status = IlpStatus::kError;
  double objective = 0.0;
  double best_bound = 0.0;
  std::vector<double> values;  // one per variable, when a solution exists
  bool has_solution() const {
    return status == IlpStatus::kOptimal || status == IlpStatus::kFeasible;
  }
  // Rounded value of an integer variable.
  long long IntValue(int var) const;
};

struct SolveOptions {
  double time_limit_s = 60.0;
  bool verbose = false;
};

class IlpModel {
 public:
  IlpModel();
  ~IlpModel();
  IlpModel(const IlpModel&) = delete;
  IlpModel& operator=(const IlpModel&) = delete;
  IlpModel(IlpModel&&) noexcept;
  IlpModel& operator=(IlpModel&&) noexcept;

  // Returns the variable's index. Infinite bounds: use +-1e30 (CBC's infinity).
  int AddVariable(double lower, double upper, double objective, bool integer,
                  const std::string& name = "");
  int AddBinary(double objective, const std::string& name = "") {
    return AddVariable(0.0, 1.0, objective, true, name);
  }
  void AddConstraint(const std::vector<std::pair<int, double>>& terms, Sense sense, double rhs,
                     const std::string& name = "");
  void SetMaximize(bool maximize);
  // Objective coefficients, to read and to replace before a solve (a second, lexicographic
  // objective is solved on a Clone() taken before the first Solve: CBC's model data are not
  // valid after it solves).
  std::vector<double> ObjectiveCoefficients() const;
  void SetObjective(int var, double coefficient);
  IlpModel Clone() const;
  // A known feasible solution (one value per variable) to start branch-and-bound from.
  void SetInitialSolution(const std::vector<double>& values);
  int num_variables() const { return num_variables_; }
  int num_constraints() const { return num_constraints_; }

  IlpSolution Solve(const SolveOptions& options = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int num_variables_ = 0;
  int num_constraints_ = 0;
};

}  // namespace tp::solver
