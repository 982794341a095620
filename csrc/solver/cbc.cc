// CBC wrapper; see cbc.h.
#include "solver/cbc.h"

#include <Cbc_C_Interface.h>

#include <cmath>
#include <stdexcept>

namespace tp::solver {

struct IlpModel::Impl {
  Cbc_Model* model = nullptr;
  Impl() : model(Cbc_newModel()) {
    if (model == nullptr) throw std::runtime_error("CBC: could not create a model");
  }
  explicit Impl(Cbc_Model* m) : model(m) {
    if (model == nullptr) throw std::runtime_error("CBC: could not clone a model");
  }
  ~Impl() {
    if (model != nullptr) Cbc_deleteModel(model);
  }
};

const char* IlpStatusName(IlpStatus status) {
  switch (status) {
    case IlpStatus::kOptimal: return "optimal";
    case IlpStatus::kFeasible: return "feasible";
    case IlpStatus::kInfeasible: return "infeasible";
    case IlpStatus::kNoSolution: return "no_solution";
    case IlpStatus::kUnbounded: return "unbounded";
    case IlpStatus::kError: return "error";
  }
  return "error";
}

long long IlpSolution::IntValue(int var) const {
  return std::llround(values.at(static_cast<size_t>(var)));
}

IlpModel::IlpModel() : impl_(std::make_unique<Impl>()) {}
IlpModel::~IlpModel() = default;
IlpModel::IlpModel(IlpModel&&) noexcept = default;
IlpModel& IlpModel::operator=(IlpModel&&) noexcept = default;

int IlpModel::AddVariable(double lower, double upper, double objective, bool integer,
                          const std::string& name) {
  if (lower > upper) {
    throw std::invalid_argument("ILP variable '" + name + "': lower bound exceeds upper bound");
  }
  const std::string col_name = name.empty() ? "x" + std::to_string(num_variables_) : name;
  Cbc_addCol(impl_->model, col_name.c_str(), lower, upper, objective, integer ? 1 : 0, 0,
             nullptr, nullptr);
  return num_variables_++;
}

void IlpModel::AddConstraint(const std::vector<std::pair<int, double>>& terms, Sense sense,
                             double rhs, const std::string& name) {
  std::vector<int> cols;
  std::vector<double> coefs;
  cols.reserve(terms.size());
  coefs.reserve(terms.size());
  for (const auto& [var, coef] : terms) {
    if (var < 0 || var >= num_variables_) {
      throw std::out_of_range("ILP constraint '" + name + "' refers to variable " +
                              std::to_string(var) + " which does not exist");
    }
    cols.push_back(var);
    coefs.push_back(coef);
  }
  const char s = sense == Sense::kLessEqual ? 'L' : sense == Sense::kGreaterEqual ? 'G' : 'E';
  const std::string row_name = name.empty() ? "r" + std::to_string(num_constraints_) : name;
  Cbc_addRow(impl_->model, row_name.c_str(), static_cast<int>(cols.size()), cols.data(),
             coefs.data(), s, rhs);
  ++num_constraints_;
}

void IlpModel::SetMaximize(bool maximize) { Cbc_setObjSense(impl_->model, maximize ? -1 : 1); }

std::vector<double> IlpModel::ObjectiveCoefficients() const {
  const double* c = Cbc_getObjCoefficients(impl_->model);
  return c == nullptr ? std::vector<double>(static_cast<size_t>(num_variables_), 0.0)
                      : std::vector<double>(c, c + num_variables_);
}

void IlpModel::SetObjective(int var, double coefficient) {
  if (var < 0 || var >= num_variables_)
    throw std::out_of_range("ILP objective: variable " + std::to_string(var) + " does not exist");
  Cbc_setObjCoeff(impl_->model, var, coefficient);
}

IlpModel IlpModel::Clone() const {
  // Cloning moves the model into CBC's solver interface, whose messages then follow the level
  // set at that time: quiet both copies (Solve raises it again when verbose).
  Cbc_setLogLevel(impl_->model, 0);
  IlpModel copy;
  copy.impl_ = std::make_unique<Impl>(Cbc_clone(impl_->model));
  copy.num_variables_ = num_variables_;
  copy.num_constraints_ = num_constraints_;
  return copy;
}

void IlpModel::SetInitialSolution(const std::vector<double>& values) {
  if (values.size() != static_cast<size_t>(num_variables_))
    throw std::invalid_argument("ILP initial solution: " + std::to_string(values.size()) +
                                " values for " + std::to_string(num_variables_) + " variables");
  Cbc_setInitialSolution(impl_->model, values.data());
}

IlpSolution IlpModel::Solve(const SolveOptions& options) {
  Cbc_Model* m = impl_->model;
  Cbc_setLogLevel(m, options.verbose ? 1 : 0);
  if (options.time_limit_s > 0) Cbc_setMaximumSeconds(m, options.time_limit_s);
  Cbc_solve(m);

  IlpSolution sol;
  const bool has_incumbent = Cbc_numberSavedSolutions(m) > 0 || Cbc_isProvenOptimal(m);
  if (Cbc_isProvenOptimal(m)) {
    sol.status = IlpStatus::kOptimal;
  } else if (Cbc_isProvenInfeasible(m)) {
    sol.status = IlpStatus::kInfeasible;
  } else if (Cbc_isContinuousUnbounded(m)) {
    sol.status = IlpStatus::kUnbounded;
  } else if (Cbc_isAbandoned(m)) {
    sol.status = IlpStatus::kError;
  } else {
    sol.status = has_incumbent ? IlpStatus::kFeasible : IlpStatus::kNoSolution;
  }
  if (sol.has_solution()) {
    const double* x = Cbc_getColSolution(m);
    if (x == nullptr) {
      sol.status = IlpStatus::kNoSolution;
    } else {
      sol.values.assign(x, x + num_variables_);
      sol.objective = Cbc_getObjValue(m);
    }
  }
  sol.best_bound = Cbc_getBestPossibleObjValue(m);
  return sol;
}

}  // namespace tp::solver
