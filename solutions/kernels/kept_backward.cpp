// The reference wrappers' kept launches with grads on, in C++: the forward and a backward
// node. A Python torch.autograd.Function runs its backward as Python on autograd's worker
// thread, which costs more than PyTorch's whole fused backward
// (docs/sweeps/2026-11-29-backward-host). Here `Plans.forward` finds the plan of x's layout,
// allocates y and the row statistics, launches the kept forward and gives y a KeptBackward
// node; the node allocates dx and the partial rows, launches the kept backward, then the
// column sums; its one Python call asks whether a profiler hooks launches (`hooked_now`).
// The kernels are kept_launch.c's Launches, run through its launch_raw. A gradient of any
// other layout goes to the Python backward (`fallback`). Built by kept_backward.py.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstring>
#include <type_traits>
#include <unordered_map>

namespace py = pybind11;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// kept_launch.c's launch_raw: fill in the raw per-call values and launch on the stream
using RawLaunch = int (*)(const void *launch, const uint64_t *values, void *stream,
                          const char **failed);
static RawLaunch launch_raw = nullptr;

// Where each per-call argument of a kept launch comes from: an input (x 0, the weight 1,
// the bias 2; where it is None, the launch's stand-in: y, or dx), or one of these.
// kept_backward.py names the same values.
constexpr int kY = -1, kGrad = -2, kDx = -3, kPartials = -4, kStat0 = -10, kStat1 = -11,
              kEps = -20;
constexpr int kMaxArguments = 16;

// What a kept launch was specialised on in a tensor (ready_launch.layout): its shape,
// strides, dtype, device and 16-byte alignment; or that there is none.
struct Layout {
  bool defined = false, aligned = false;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

static uint64_t address(const at::Tensor &t) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()));
}

static Layout layout_of(const at::Tensor &t) {
  Layout l;
  if (!t.defined()) return l;
  l.defined = true, l.aligned = address(t) % 16 == 0;
  l.sizes = t.sizes().vec(), l.strides = t.strides().vec();
  l.dtype = t.scalar_type(), l.device = t.device();
  return l;
}

static bool same_layout(const Layout &l, const at::Tensor &t) {
  if (l.defined != t.defined()) return false;
  return !t.defined() || (t.sizes() == l.sizes && t.strides() == l.strides &&
                          t.scalar_type() == l.dtype && t.device() == l.device &&
                          (address(t) % 16 == 0) == l.aligned);
}

// The key a plan is kept under, as ready_launch.launch_key: the current device, then for
// x and each parameter its dtype, device, 16-byte alignment, shape and strides, or -1 for
// None. False where one is not a CUDA tensor: no plan is kept for it.
static bool layout_key(std::vector<int64_t> &key, c10::DeviceIndex current,
                       const at::Tensor *inputs, int64_t count) {
  key.push_back(current);
  for (int64_t i = 0; i < count; i++) {
    const at::Tensor &t = inputs[i];
    if (!t.defined()) {
      key.push_back(-1);
      continue;
    }
    if (!t.is_cuda()) return false;
    key.insert(key.end(), {static_cast<int64_t>(t.scalar_type()), t.get_device(),
                           address(t) % 16 == 0, t.dim()});
    key.insert(key.end(), t.sizes().begin(), t.sizes().end());
    key.insert(key.end(), t.strides().begin(), t.strides().end());
  }
  return true;
}

// Saved for the backward, in the Function's order (so that checkpointing, which compares
// what a forward saved with what its recomputation saves, sees the same either way)
constexpr int kSaved = 4;  // x, the weight, then one or two statistics

struct Plan {
  // The ReadyLaunches (sums may be None), which hold their compiled kernels and Launches
  // alive; the Python backward
  py::object forward, backward, sums, fallback;
  const void *forward_launch = nullptr, *backward_launch = nullptr, *sums_launch = nullptr;
  std::vector<int> forward_sources, backward_sources;  // per per-call argument, as above
  int64_t inputs = 0, stats = 0;     // x and its parameters; float32 statistics a row
  c10::Device device = c10::Device(c10::DeviceType::CUDA, 0);  // the launches' device
  std::vector<int64_t> key;   // where Plans keeps it (layout_key); empty off the GPU
  std::vector<Layout> saved;  // what the kept backward was made for: x, weight, statistics
  Layout grad;                // and the gradient (y's layout)
  std::vector<int64_t> partials_shape;  // (sets, n) or (sets, programs, n)
  at::ScalarType partials_dtype, sums_dtype;
  std::string name;

  ~Plan() {  // Python objects let go with the GIL; left alone once Python is finishing
#if PY_VERSION_HEX >= 0x030D0000
    bool finishing = Py_IsFinalizing();
#else
    bool finishing = _Py_IsFinalizing();
#endif
    if (!Py_IsInitialized() || finishing) {
      forward.release(), backward.release(), sums.release(), fallback.release();
      return;
    }
    py::gil_scoped_acquire gil;
    forward = backward = sums = fallback = py::object();
  }
};

// Whether a profiler hooks Triton's launches now (kept_backward.launch_hooked, given by
// kept_backward.py): one set after a forward must still see its backward's launches, which
// the Python backward's launches call and these do not
static PyObject *launch_hooked = nullptr;
static bool hooked_now() {
  if (!launch_hooked) return false;
  py::gil_scoped_acquire gil;  // cheap on autograd's threads: each keeps a thread state
  return py::reinterpret_borrow<py::object>(launch_hooked)().cast<bool>();
}

// On the current stream of the device the launch was kept for, as ReadyLaunch.run does
static void launch(const Plan &plan, const void *kept, const uint64_t *values) {
  void *stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
                     ->getStream(plan.device).native_handle();
  const char *failed = "";
  int code = launch_raw(kept, values, stream, &failed);
  TORCH_CHECK(code == 0, "kept launch: ", failed, " failed (CUDA error ", code, ")");
}

// The per-call values of a launch: `inputs` (an undefined one: `stand_in`), the tensors
// kY... kPartials stand for, `stats` the statistics a row.
static void fill(uint64_t *values, const std::vector<int> &sources, const at::Tensor *inputs,
                 const at::Tensor &stand_in, const at::Tensor &y, const at::Tensor &dy,
                 const at::Tensor &dx, const at::Tensor &partials, const at::Tensor *stats,
                 double eps) {
  for (size_t i = 0; i < sources.size(); i++) {
    int source = sources[i];
    if (source >= 0) {
      values[i] = address(inputs[source].defined() ? inputs[source] : stand_in);
    } else if (source == kStat0 || source == kStat1) {
      values[i] = address(stats[kStat0 - source]);
    } else if (source == kEps) {
      float f = static_cast<float>(eps);
      values[i] = 0;
      std::memcpy(&values[i], &f, sizeof f);
    } else {
      values[i] = address(source == kY ? y : source == kGrad ? dy : source == kDx ? dx
                                                                               : partials);
    }
  }
}

struct KeptBackward : Node {
  std::shared_ptr<Plan> plan;
  SavedVariable saved[kSaved];  // x, the weight, the statistics (as the Function saves them)

  std::string name() const override { return plan->name; }
  void release_variables() override {
    for (auto &s : saved) s.reset_data();
  }

  variable_list apply(variable_list &&grads) override {
    const at::Tensor &dy = grads[0];
    at::Tensor tensors[kSaved];  // x, weight, then the statistics
    for (int i = 0; i < 2 + plan->stats; i++) tensors[i] = saved[i].unpack();
    const at::Tensor &x = tensors[0];
    variable_list out(num_outputs());
    if (!dy.defined()) return out;
    // What the kept launch was made for: dy as y, and the saved tensors as the forward
    // saved them (a saved-tensor hook may give back a copy laid out otherwise)
    bool kept = x.is_cuda() && same_layout(plan->grad, dy);
    for (int i = 0; kept && i < 2 + plan->stats; i++)
      kept = same_layout(plan->saved[i], tensors[i]);
    if (!kept || hooked_now()) return python_backward(tensors, dy);
    at::Tensor dx = at::empty_like(x);  // as the Python kept path: torch.empty_like(x)
    at::Tensor partials =
        at::empty(plan->partials_shape, x.options().dtype(plan->partials_dtype));
    uint64_t values[kMaxArguments];
    fill(values, plan->backward_sources, tensors, dx, at::Tensor(), dy, dx, partials,
         tensors + 2, 0.0);
    launch(*plan, plan->backward_launch, values);
    out[0] = dx;
    bool any_parameter = false;
    for (size_t i = 1; i < out.size(); i++) any_parameter |= task_should_compute_output(i);
    if (!any_parameter) return out;
    at::Tensor sums = partials;  // one program wrote the sums themselves
    if (plan->sums_launch) {
      sums = at::empty({plan->partials_shape[0], plan->partials_shape.back()},
                       x.options().dtype(plan->sums_dtype));
      uint64_t sum_values[2] = {address(partials), address(sums)};
      launch(*plan, plan->sums_launch, sum_values);
    }
    for (size_t i = 1; i < out.size(); i++)
      if (task_should_compute_output(i)) out[i] = sums.select(0, i - 1);
    return out;
  }

  // fallback(x, weight, *statistics, dy) -> a gradient per input (or None)
  variable_list python_backward(const at::Tensor *tensors, const at::Tensor &dy) {
    py::gil_scoped_acquire gil;
    py::list args;
    for (int i = 0; i < 2 + plan->stats; i++)
      args.append(tensors[i].defined() ? py::cast(tensors[i]) : py::none());
    args.append(py::cast(dy));
    py::tuple grads = plan->fallback(*args);
    variable_list out(num_outputs());
    for (size_t i = 0; i < out.size() && i < grads.size(); i++)
      if (!grads[i].is_none() && task_should_compute_output(i))
        out[i] = grads[i].cast<at::Tensor>();
    return out;
  }
};

// The node's pointer as this torch keeps nodes: a shared_ptr up to torch 2.12, an
// intrusive_ptr after.
using NodePtr = decltype(torch::autograd::Edge().function);
template <class Pointer = NodePtr>
static Pointer new_node(KeptBackward *&node) {
  if constexpr (std::is_same_v<Pointer, std::shared_ptr<Node>>) {
    auto made = std::make_shared<KeptBackward>();
    node = made.get();
    return made;
  } else {
    auto made = c10::make_intrusive<KeptBackward>();
    node = made.get();
    return made;
  }
}

using MaybeTensor = std::optional<at::Tensor>;

// y's history: a node of `plan` over x and its parameters, keeping x, the weight and each
// of the forward's statistics (the rows of `stats`, (statistics, rows) float32).
static at::Tensor attach(const std::shared_ptr<Plan> &plan, at::Tensor y, const at::Tensor &x,
                         const MaybeTensor &weight, const MaybeTensor &bias,
                         const at::Tensor &stats) {
  variable_list edges_of = {x, weight.value_or(at::Tensor()), bias.value_or(at::Tensor())};
  edges_of.resize(plan->inputs);
  KeptBackward *node = nullptr;
  NodePtr pointer = new_node(node);
  node->plan = plan;
  node->set_next_edges(torch::autograd::collect_next_edges(edges_of));
  node->saved[0] = SavedVariable(x, false);
  node->saved[1] = SavedVariable(weight.value_or(at::Tensor()), false);
  for (int64_t k = 0; k < plan->stats; k++)
    node->saved[2 + k] = SavedVariable(stats.select(0, k), false);
  torch::autograd::set_history(y, pointer);
  return y;
}

// The kept forward with grads on: y and its statistics allocated and launched as the
// Python kept path does, y given the node. `inputs`: x, the weight and the bias (undefined
// where None), of the layouts the plan was kept for; eps checked by the caller.
static at::Tensor forward(const std::shared_ptr<Plan> &plan, const at::Tensor *inputs,
                          double eps) {
  const at::Tensor &x = inputs[0];
  at::Tensor y = at::empty_like(x);
  std::vector<int64_t> stats_shape = {plan->stats};
  stats_shape.insert(stats_shape.end(), x.sizes().begin(), x.sizes().end() - 1);
  at::Tensor stats = at::empty(stats_shape, x.options().dtype(at::kFloat));
  at::Tensor rows[2] = {stats[0], plan->stats > 1 ? stats[1] : stats[0]};
  uint64_t values[kMaxArguments];
  fill(values, plan->forward_sources, inputs, y, y, at::Tensor(), at::Tensor(), at::Tensor(),
       rows, eps);
  launch(*plan, plan->forward_launch, values);
  auto maybe = [](const at::Tensor &t) { return t.defined() ? MaybeTensor(t) : std::nullopt; };
  return attach(plan, y, x, maybe(inputs[1]), maybe(inputs[2]), stats);
}

static c10::DeviceIndex current_device() {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index();
}

// A wrapper's plans by layout_key, looked up here on every forward with grads on (in
// Python, the key alone cost about as much as PyTorch's whole forward's host time).
struct Plans {
  struct Hash {
    size_t operator()(const std::vector<int64_t> &key) const {
      size_t h = key.size();
      for (int64_t v : key) h ^= std::hash<int64_t>()(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
      return h;
    }
  };
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<Plan>, Hash> by_key;

  // x and its parameters from Python: false where one is neither a tensor nor None
  static bool unpack(py::handle x, py::handle weight, py::handle bias, at::Tensor *inputs) {
    py::handle given[3] = {x, weight, bias};
    for (int i = 0; i < 3; i++) {
      if (given[i].is_none() && i > 0) continue;
      if (!THPVariable_Check(given[i].ptr())) return false;
      inputs[i] = THPVariable_Unpack(given[i].ptr());
    }
    return true;
  }

  std::shared_ptr<Plan> find(const at::Tensor *inputs) const {
    if (by_key.empty() || !inputs[0].is_cuda()) return nullptr;  // (no CUDA device to ask)
    std::vector<int64_t> key;
    key.reserve(32);
    if (!layout_key(key, current_device(), inputs, 3)) return nullptr;
    auto found = by_key.find(key);
    return found == by_key.end() ? nullptr : found->second;
  }

  // y from the plan of these layouts, its grad_fn a node; None where none is kept
  py::object forward(py::handle x, py::handle weight, py::handle bias, double eps) const {
    at::Tensor inputs[3];
    if (!unpack(x, weight, bias, inputs)) return py::none();
    std::shared_ptr<Plan> plan = find(inputs);
    return plan ? py::cast(::forward(plan, inputs, eps)) : py::none();
  }

  bool has(py::handle x, py::handle weight, py::handle bias) const {
    at::Tensor inputs[3];
    return unpack(x, weight, bias, inputs) && find(inputs) != nullptr;
  }
};

PYBIND11_MODULE(kept_backward, m) {
  m.def(
      "check_launch_hooks_with",
      [](py::object hooked) {
        Py_XDECREF(launch_hooked);
        launch_hooked = hooked.is_none() ? nullptr : hooked.release().ptr();
      },
      "check_launch_hooks_with(hooked): a node's backward asks hooked() whether a profiler "
      "hooks launches now, and if so takes the Python backward (None: it never asks)");
  py::class_<Plan, std::shared_ptr<Plan>>(m, "Plan")
      .def(py::init([](py::object forward, py::object backward, py::object sums,
                       py::object raw, std::vector<int> forward_sources,
                       std::vector<int> backward_sources, const std::vector<MaybeTensor> &inputs,
                       const std::vector<MaybeTensor> &saved, const at::Tensor &grad,
                       std::vector<int64_t> partials_shape, at::ScalarType partials_dtype,
                       at::ScalarType sums_dtype, py::object fallback, std::string name) {
             if (!launch_raw)
               launch_raw = reinterpret_cast<RawLaunch>(
                   PyCapsule_GetPointer(raw.ptr(), "kept_launch.launch_raw"));
             if (!launch_raw) throw py::error_already_set();
             TORCH_CHECK(forward_sources.size() <= kMaxArguments &&
                             backward_sources.size() <= kMaxArguments,
                         "kept launch: at most 16 per-call arguments");
             int64_t stats = static_cast<int64_t>(saved.size()) - 2;
             TORCH_CHECK(inputs.size() >= 1 && inputs.size() <= 3 && stats >= 1 && stats <= 2,
                         "kept launch: x and up to two parameters; saved x, the weight and "
                         "one or two statistics");
             auto plan = std::make_shared<Plan>();
             plan->forward = forward, plan->backward = backward, plan->sums = sums;
             plan->fallback = fallback;
             for (auto &t : saved) plan->saved.push_back(layout_of(t.value_or(at::Tensor())));
             plan->grad = layout_of(grad);
             plan->device = c10::Device(c10::DeviceType::CUDA,
                                        forward.attr("device").cast<c10::DeviceIndex>());
             plan->forward_launch = forward.attr("kept").ptr();  // kept_launch.Launches
             plan->backward_launch = backward.attr("kept").ptr();
             plan->sums_launch = sums.is_none() ? nullptr : sums.attr("kept").ptr();
             plan->forward_sources = std::move(forward_sources);
             plan->backward_sources = std::move(backward_sources);
             plan->inputs = static_cast<int64_t>(inputs.size()), plan->stats = stats;
             at::Tensor layouts[3];
             for (size_t i = 0; i < inputs.size(); i++)
               layouts[i] = inputs[i].value_or(at::Tensor());
             if (!layout_key(plan->key, plan->device.index(), layouts, 3)) plan->key.clear();
             plan->partials_shape = std::move(partials_shape);
             plan->partials_dtype = partials_dtype, plan->sums_dtype = sums_dtype;
             plan->name = std::move(name);
             return plan;
           }),
           "Plan(forward, backward, sums, launch_raw, forward_sources, backward_sources, "
           "inputs, saved, grad, partials_shape, partials_dtype, sums_dtype, fallback, "
           "name): ReadyLaunches whose launches are kept in C; inputs (x and its "
           "parameters), the tensors the forward was made for; saved and grad, those the "
           "kept backward was made for")
      .def("attach", &attach,
           "attach(y, x, weight, bias, stats) -> y, its grad_fn a node keeping x, the "
           "weight and each row of stats ((statistics, rows) float32)");
  py::class_<Plans>(m, "Plans")
      .def(py::init<>())
      .def("add",
           [](Plans &plans, const std::shared_ptr<Plan> &plan) {
             TORCH_CHECK(!plan->key.empty(), "kept launch: a plan is kept for CUDA tensors");
             plans.by_key[plan->key] = plan;
           })
      .def("forward", &Plans::forward,
           "forward(x, weight, bias, eps) -> y from the plan kept for these layouts on the "
           "current device, its grad_fn a node; None where none is kept")
      .def("has", &Plans::has, "has(x, weight, bias): whether a plan is kept for these")
      .def("__len__", [](const Plans &plans) { return plans.by_key.size(); });
}
