#include "train/optimizer_state.h"

#include <functional>
#include <memory>
#include <typeindex>

#include "common/error.h"
#include "train/optim/lamb.h"
#include "train/optim/lars.h"
#include "train/tensor_types.h"

namespace shoal::train {

namespace {

using torch::optim::OptimizerParamState;

// One named tensor of a state class, and whether this parameter's settings need it.
struct Slot {
  const char* name;
  bool required;
  std::function<torch::Tensor&(OptimizerParamState&)> field;
};

// How one optimizer type keeps a parameter's state.
struct Codec {
  const char* type;
  std::type_index stateType;
  std::vector<Slot> slots;
  std::function<std::unique_ptr<OptimizerParamState>()> make;
  std::function<int64_t&(OptimizerParamState&)> step;  // null: the type counts no steps
};

template <typename State, typename Get>
Slot slot(const char* name, bool required, Get get) {
  return {name, required,
          [get](OptimizerParamState& s) -> torch::Tensor& { return get(static_cast<State&>(s)); }};
}

template <typename State, bool kCounted>
Codec codec(const char* type, std::vector<Slot> slots) {
  Codec c{type, std::type_index(typeid(State)), std::move(slots),
          [] { return std::make_unique<State>(); }, nullptr};
  if constexpr (kCounted) {
    c.step = [](OptimizerParamState& s) -> int64_t& { return static_cast<State&>(s).step(); };
  }
  return c;
}

template <typename Options, typename State>
Codec adamLike(const char* type, const torch::optim::OptimizerOptions& options) {
  const bool amsgrad = static_cast<const Options&>(options).amsgrad();
  return codec<State, true>(
      type,
      {slot<State>("exp_avg", true, [](State& s) -> torch::Tensor& { return s.exp_avg(); }),
       slot<State>("exp_avg_sq", true, [](State& s) -> torch::Tensor& { return s.exp_avg_sq(); }),
       slot<State>("max_exp_avg_sq", amsgrad,
                   [](State& s) -> torch::Tensor& { return s.max_exp_avg_sq(); })});
}

// The codec for the optimizer's type, with the requirements of the given group's settings.
Codec codecFor(torch::optim::Optimizer& opt, const torch::optim::OptimizerOptions& options) {
  namespace o = torch::optim;
  if (dynamic_cast<o::SGD*>(&opt)) {
    using S = o::SGDParamState;
    const bool momentum = static_cast<const o::SGDOptions&>(options).momentum() != 0;
    return codec<S, false>("SGD", {slot<S>("momentum_buffer", momentum, [](S& s) -> torch::Tensor& {
                             return s.momentum_buffer();
                           })});
  }
  if (dynamic_cast<o::Adam*>(&opt))
    return adamLike<o::AdamOptions, o::AdamParamState>("Adam", options);
  if (dynamic_cast<o::AdamW*>(&opt)) {
    return adamLike<o::AdamWOptions, o::AdamWParamState>("AdamW", options);
  }
  if (dynamic_cast<o::RMSprop*>(&opt)) {
    using S = o::RMSpropParamState;
    const auto& r = static_cast<const o::RMSpropOptions&>(options);
    return codec<S, true>(
        "RMSprop",
        {slot<S>("square_avg", true, [](S& s) -> torch::Tensor& { return s.square_avg(); }),
         slot<S>("momentum_buffer", r.momentum() > 0,
                 [](S& s) -> torch::Tensor& { return s.momentum_buffer(); }),
         slot<S>("grad_avg", r.centered(), [](S& s) -> torch::Tensor& { return s.grad_avg(); })});
  }
  if (dynamic_cast<Lamb*>(&opt)) {
    using S = LambParamState;
    return codec<S, true>(
        "Lamb",
        {slot<S>("exp_avg", true, [](S& s) -> torch::Tensor& { return s.exp_avg(); }),
         slot<S>("exp_avg_sq", true, [](S& s) -> torch::Tensor& { return s.exp_avg_sq(); })});
  }
  if (dynamic_cast<Lars*>(&opt)) {
    using S = LarsParamState;
    const bool momentum = static_cast<const LarsOptions&>(options).momentum() != 0;
    return codec<S, false>("Lars",
                           {slot<S>("momentum_buffer", momentum,
                                    [](S& s) -> torch::Tensor& { return s.momentum_buffer(); })});
  }
  SHOAL_THROW(InvalidArgument,
              "optimizer state: unsupported optimizer type (SGD, Adam, AdamW, RMSprop, Lamb, "
              "Lars)");
}

struct Located {
  torch::Tensor param;
  const torch::optim::OptimizerOptions* options;
};

Located locate(torch::optim::Optimizer& opt, size_t index) {
  size_t seen = 0;
  for (auto& group : opt.param_groups()) {
    const auto& params = group.params();
    if (index < seen + params.size()) return {params[index - seen], &group.options()};
    seen += params.size();
  }
  SHOAL_THROW(InvalidArgument, "optimizer state: parameter {} out of range of {}", index, seen);
}

std::string keyOf(const torch::Tensor& param) {
  return c10::guts::to_string(param.unsafeGetTensorImpl());
}

}  // namespace

std::optional<ParamState> exportState(torch::optim::Optimizer& opt, size_t index) {
  const Located at = locate(opt, index);
  const Codec c = codecFor(opt, *at.options);
  auto it = opt.state().find(keyOf(at.param));
  if (it == opt.state().end() || !it->second) return std::nullopt;
  auto& state = *it->second;
  SHOAL_ASSERT(std::type_index(typeid(state)) == c.stateType, "{} holds state of another type",
               c.type);
  ParamState out;
  if (c.step) out.step = c.step(state);
  for (const auto& s : c.slots) {
    const auto& t = s.field(state);
    if (t.defined()) out.tensors.emplace_back(s.name, t);
  }
  return out;
}

void importState(torch::optim::Optimizer& opt, size_t index, const ParamState& state) {
  const Located at = locate(opt, index);
  const Codec c = codecFor(opt, *at.options);
  SHOAL_CHECK(state.step >= 0 && (c.step || state.step == 0),
              "optimizer state of parameter {}: step {} for {}", index, state.step, c.type);
  std::vector<bool> given(c.slots.size(), false);
  for (const auto& [name, t] : state.tensors) {
    size_t k = 0;
    while (k < c.slots.size() && name != c.slots[k].name) ++k;
    if (k == c.slots.size()) {
      SHOAL_THROW(InvalidArgument, "optimizer state of parameter {}: unknown key '{}' for {}",
                  index, name, c.type);
    }
    if (given[k]) {
      SHOAL_THROW(InvalidArgument, "optimizer state of parameter {}: key '{}' given twice", index,
                  name);
    }
    given[k] = true;
    if (!t.defined() || t.sizes() != at.param.sizes() ||
        t.scalar_type() != at.param.scalar_type()) {
      SHOAL_THROW(InvalidArgument, "optimizer state of parameter {}: '{}' is {}, the parameter {}",
                  index, name, describe(t), describe(at.param));
    }
  }
  for (size_t k = 0; k < c.slots.size(); ++k) {
    if (c.slots[k].required && !given[k]) {
      SHOAL_THROW(InvalidArgument, "optimizer state of parameter {}: '{}' is missing for {}", index,
                  c.slots[k].name, c.type);
    }
  }
  auto fresh = c.make();
  if (c.step) c.step(*fresh) = state.step;
  for (const auto& [name, t] : state.tensors) {
    for (const auto& s : c.slots) {
      if (name == s.name) {
        s.field(*fresh) = t.detach().to(at.param.device()).clone(torch::MemoryFormat::Contiguous);
      }
    }
  }
  opt.state()[keyOf(at.param)] = std::move(fresh);
}

void clearState(torch::optim::Optimizer& opt, size_t index) {
  opt.state().erase(keyOf(locate(opt, index).param));
}

void replaceStates(torch::optim::Optimizer& opt,
                   const std::vector<std::optional<ParamState>>& states) {
  // What the optimizer held is kept aside (copied: exportState aliases) and put back when a
  // parameter's state does not fit.
  std::vector<std::optional<ParamState>> before(states.size());
  for (size_t i = 0; i < states.size(); ++i) {
    if (auto s = exportState(opt, i)) {
      for (auto& [key, t] : s->tensors) t = t.clone();
      before[i] = std::move(s);
    }
  }
  auto put = [&](size_t i, const std::optional<ParamState>& s) {
    if (s) {
      importState(opt, i, *s);
    } else {
      clearState(opt, i);
    }
  };
  for (size_t i = 0; i < states.size(); ++i) {
    try {
      put(i, states[i]);
    } catch (const InvalidArgument& e) {
      for (size_t j = 0; j < i; ++j) put(j, before[j]);
      SHOAL_THROW(InvalidArgument, "the optimizer state of parameter {} does not fit: {}", i,
                  e.what());
    }
  }
}

}  // namespace shoal::train
