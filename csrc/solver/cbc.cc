// CBC wrapper; see cbc.h.
#include "solver/cbc.h"

#include <Cbc_C_Interface.h>

#include <cfloat>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace tp::solver {

// Variables and constraints are buffered and handed to CBC in one Cbc_loadProblem at the
// first call that needs the model: CBC appends each row to its column-major matrix by copying
// the matrix (quadratic in the rows), which made building a 7,000-variable sharding ILP cost
// as much as solving it. Additions after that go to CBC directly.
struct IlpModel::Impl {
  Cbc_Model* model = nullptr;
  bool loaded = false;
  std::vector<double> col_lb, col_ub, obj;
  std::vector<char> integer;
  std::vector<std::string> col_names, row_names;
  std::vector<int> row_start{0}, row_cols;
  std::vector<double> row_vals, row_lb, row_ub;

  void Load() {
    if (loaded) return;
    loaded = true;
    const size_t ncols = obj.size(), nrows = row_lb.size();
    // Rows to the column-major (CSC) form CBC loads.
    std::vector<CoinBigIndex> start(ncols + 1, 0);
    for (int c : row_cols) ++start[static_cast<size_t>(c) + 1];
    for (size_t c = 0; c < ncols; ++c) start[c + 1] += start[c];
    std::vector<int> index(row_cols.size());
    std::vector<double> value(row_cols.size());
    std::vector<CoinBigIndex> next(start.begin(), start.end() - 1);
    for (size_t r = 0; r < nrows; ++r) {
      for (int k = row_start[r]; k < row_start[r + 1]; ++k) {
        const auto c = static_cast<size_t>(row_cols[static_cast<size_t>(k)]);
        index[static_cast<size_t>(next[c])] = static_cast<int>(r);
        value[static_cast<size_t>(next[c]++)] = row_vals[static_cast<size_t>(k)];
      }
    }
    if (ncols == 0 && nrows == 0) return;
    Cbc_loadProblem(model, static_cast<int>(ncols), static_cast<int>(nrows), start.data(),
                    index.data(), value.data(), col_lb.data(), col_ub.data(), obj.data(),
                    row_lb.data(), row_ub.data());
    for (size_t c = 0; c < ncols; ++c) {
      if (integer[c]) Cbc_setInteger(model, static_cast<int>(c));
      Cbc_setColName(model, static_cast<int>(c), col_names[c].c_str());
    }
    for (size_t r = 0; r < nrows; ++r)
      Cbc_setRowName(model, static_cast<int>(r), row_names[r].c_str());
    col_lb = col_ub = obj = row_vals = row_lb = row_ub = {};
    integer = {};
    col_names = row_names = {};
    row_start = row_cols = {};
  }

  Impl() : model(Cbc_newModel()) {
    if (model == nullptr) throw std::runtime_error("CBC: could not create a model");
  }
  explicit Impl(Cbc_Model* m) : model(m), loaded(true) {
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
  std::string col_name = name.empty() ? "x" + std::to_string(num_variables_) : name;
  Impl& m = *impl_;
  if (m.loaded) {
    Cbc_addCol(m.model, col_name.c_str(), lower, upper, objective, integer ? 1 : 0, 0, nullptr,
               nullptr);
  } else {
    m.col_lb.push_back(lower);
    m.col_ub.push_back(upper);
    m.obj.push_back(objective);
    m.integer.push_back(integer ? 1 : 0);
    m.col_names.push_back(std::move(col_name));
  }
  return num_variables_++;
}

void IlpModel::AddConstraint(const std::vector<std::pair<int, double>>& terms, Sense sense,
                             double rhs, const std::string& name) {
  for (const auto& [var, coef] : terms) {
    if (var < 0 || var >= num_variables_) {
      throw std::out_of_range("ILP constraint '" + name + "' refers to variable " +
                              std::to_string(var) + " which does not exist");
    }
  }
  std::string row_name = name.empty() ? "r" + std::to_string(num_constraints_) : name;
  Impl& m = *impl_;
  if (m.loaded) {
    std::vector<int> cols;
    std::vector<double> coefs;
    for (const auto& [var, coef] : terms) cols.push_back(var), coefs.push_back(coef);
    const char s = sense == Sense::kLessEqual ? 'L' : sense == Sense::kGreaterEqual ? 'G' : 'E';
    Cbc_addRow(m.model, row_name.c_str(), static_cast<int>(cols.size()), cols.data(),
               coefs.data(), s, rhs);
  } else {
    for (const auto& [var, coef] : terms) m.row_cols.push_back(var), m.row_vals.push_back(coef);
    m.row_start.push_back(static_cast<int>(m.row_cols.size()));
    m.row_lb.push_back(sense == Sense::kLessEqual ? -DBL_MAX : rhs);
    m.row_ub.push_back(sense == Sense::kGreaterEqual ? DBL_MAX : rhs);
    m.row_names.push_back(std::move(row_name));
  }
  ++num_constraints_;
}

void IlpModel::SetMaximize(bool maximize) {
  impl_->Load();
  Cbc_setObjSense(impl_->model, maximize ? -1 : 1);
}

std::vector<double> IlpModel::ObjectiveCoefficients() const {
  if (!impl_->loaded) return impl_->obj;
  const double* c = Cbc_getObjCoefficients(impl_->model);
  return c == nullptr ? std::vector<double>(static_cast<size_t>(num_variables_), 0.0)
                      : std::vector<double>(c, c + num_variables_);
}

void IlpModel::SetObjective(int var, double coefficient) {
  if (var < 0 || var >= num_variables_)
    throw std::out_of_range("ILP objective: variable " + std::to_string(var) + " does not exist");
  if (!impl_->loaded) {
    impl_->obj[static_cast<size_t>(var)] = coefficient;
    return;
  }
  Cbc_setObjCoeff(impl_->model, var, coefficient);
}

IlpModel IlpModel::Clone() const {
  // Cloning moves the model into CBC's solver interface, whose messages then follow the level
  // set at that time: quiet both copies (Solve raises it again when verbose).
  impl_->Load();
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
  impl_->Load();
  Cbc_setInitialSolution(impl_->model, values.data());
}

IlpSolution IlpModel::Solve(const SolveOptions& options) {
  impl_->Load();
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
