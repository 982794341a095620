// Binds a plain C++ struct (pass options, plans) as a Python class with keyword construction,
// a readable repr and to_dict(), from one list of fields. No LibTorch.
#pragma once

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tp::bindings {

namespace py = pybind11;

// A value as to_dict writes it: nested bound structs become dicts, sequences lists.
inline py::object Plain(const py::handle& v) {
  if (py::hasattr(v, "to_dict")) return v.attr("to_dict")();
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    py::list out;
    for (auto item : v) out.append(Plain(item));
    return std::move(out);
  }
  if (py::isinstance<py::dict>(v)) {
    py::dict out;
    for (auto item : v.cast<py::dict>()) out[item.first] = Plain(item.second);
    return std::move(out);
  }
  return py::reinterpret_borrow<py::object>(v);
}

template <class T>
class Struct {
 public:
  // `summary`: a readable one- or multi-line form for repr (plans); absent, the repr lists the
  // fields as keyword arguments (options).
  Struct(py::module_& m, const char* name, const char* doc,
         std::function<std::string(const T&)> summary = nullptr)
      : cls_(m, name, doc), fields_(std::make_shared<Fields>()) {
    fields_->type = name;
    auto fields = fields_;
    cls_.def(py::init([fields](const py::kwargs& kwargs) {
               T t;
               for (auto item : kwargs) {
                 const auto key = item.first.cast<std::string>();
                 auto it = fields->setters.find(key);
                 if (it == fields->setters.end()) {
                   std::string valid;
                   for (const auto& n : fields->writable) valid += (valid.empty() ? "" : ", ") + n;
                   throw py::type_error(fields->type + ": unknown field '" + key +
                                        "'; fields: " + valid);
                 }
                 it->second(t, item.second);
               }
               return t;
             }),
             "Keyword arguments set fields by name; the rest keep their defaults.");
    cls_.def("to_dict", [fields](const py::object& self) {
      py::dict out;
      for (const auto& n : fields->names) out[py::str(n)] = Plain(self.attr(n.c_str()));
      return out;
    });
    if (summary) {
      cls_.def("__repr__", [summary](const T& t) { return summary(t); });
    } else {
      cls_.def("__repr__", [fields](const py::object& self) {
        std::string s = fields->type + "(";
        for (size_t i = 0; i < fields->names.size(); ++i) {
          const auto& n = fields->names[i];
          s += (i ? ", " : "") + n + "=" +
               py::repr(self.attr(n.c_str())).template cast<std::string>();
        }
        return s + ")";
      });
    }
  }

  // A read-write field, settable by keyword.
  template <class F>
  Struct& field(const char* name, F T::*member, const char* doc = "") {
    cls_.def_readwrite(name, member, doc);
    fields_->names.push_back(name);
    fields_->writable.push_back(name);
    auto fields = fields_;
    fields_->setters[name] = [member, fields, name](T& t, const py::handle& v) {
      try {
        t.*member = v.cast<F>();
      } catch (const py::cast_error&) {
        const py::object now = py::cast(t.*member);
        throw py::type_error(fields->type + "." + name + " takes a " +
                             py::str(now.get_type().attr("__name__")).cast<std::string>() +
                             ", got " + py::repr(v).cast<std::string>());
      }
    };
    return *this;
  }
  // A field whose Python form differs from its C++ one (an enum as a string): get(const T&)
  // returns the Python value, set(T&, value) converts and validates it.
  template <class Get, class Value>
  Struct& property(const char* name, Get get, void (*set)(T&, const Value&), const char* doc = "") {
    cls_.def_property(name, get, set, doc);
    fields_->names.push_back(name);
    fields_->writable.push_back(name);
    fields_->setters[name] = [set](T& t, const py::handle& v) { set(t, v.cast<Value>()); };
    return *this;
  }
  // A computed, read-only field (plans: a C++ map of typed specs shown as strings, ...).
  template <class Getter>
  Struct& computed(const char* name, Getter getter, const char* doc = "") {
    cls_.def_property_readonly(name, getter, doc);
    fields_->names.push_back(name);
    return *this;
  }
  py::class_<T>& cls() { return cls_; }

 private:
  struct Fields {
    std::string type;
    std::vector<std::string> names, writable;
    std::map<std::string, std::function<void(T&, const py::handle&)>> setters;
  };
  py::class_<T> cls_;
  std::shared_ptr<Fields> fields_;
};

}  // namespace tp::bindings
