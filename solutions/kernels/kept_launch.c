/* A compiled Triton kernel's launch, its fixed arguments packed once, run again with new
 * pointers. Triton's own launcher parses every argument from Python and asks the driver
 * about every pointer on each call; this one fills in only what changes (the tensors and
 * eps) and calls cuLaunchKernel. Built by ready_launch.py with Triton's C toolchain; no
 * CUDA headers needed: the few driver functions used are looked up in libcuda at run time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

/* The most parameters a kept kernel may take (the reference kernels take under 30): each
 * call fills a copy of them on its own stack, so threads never share one being filled. */
#define MAX_PARAMS 64

typedef int CUresult;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUcontext;
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*param_info_fn)(CUfunction, size_t, size_t *, size_t *);
typedef CUresult (*current_context_fn)(CUcontext *);
typedef CUresult (*set_context_fn)(CUcontext);
typedef CUresult (*device_get_fn)(int *, int);
typedef CUresult (*primary_context_fn)(CUcontext *, int);
typedef CUresult (*error_string_fn)(CUresult, const char **);

static launch_fn cu_launch;
static param_info_fn cu_param_info;  /* CUDA 12.4 and later */
static current_context_fn cu_current_context;
static set_context_fn cu_set_context;
static device_get_fn cu_device_get;
static primary_context_fn cu_primary_context;
static error_string_fn cu_error_string;

static int load_driver(void) {
  if (cu_launch) return 0;
  void *lib = dlopen("libcuda.so.1", RTLD_LAZY);
  if (!lib) {
    PyErr_SetString(PyExc_RuntimeError, "kept_launch: libcuda.so.1 cannot be opened");
    return -1;
  }
  cu_param_info = (param_info_fn)dlsym(lib, "cuFuncGetParamInfo");
  cu_current_context = (current_context_fn)dlsym(lib, "cuCtxGetCurrent");
  cu_set_context = (set_context_fn)dlsym(lib, "cuCtxSetCurrent");
  cu_device_get = (device_get_fn)dlsym(lib, "cuDeviceGet");
  cu_primary_context = (primary_context_fn)dlsym(lib, "cuDevicePrimaryCtxRetain");
  cu_error_string = (error_string_fn)dlsym(lib, "cuGetErrorString");
  cu_launch = (launch_fn)dlsym(lib, "cuLaunchKernel");
  if (!cu_launch || !cu_current_context || !cu_set_context || !cu_device_get ||
      !cu_primary_context || !cu_error_string) {
    cu_launch = NULL;
    PyErr_SetString(PyExc_RuntimeError, "kept_launch: libcuda lacks cuLaunchKernel");
    return -1;
  }
  return 0;
}

static PyObject *driver_error(const char *what, CUresult code) {
  const char *text = "unknown error";
  cu_error_string(code, &text);
  return PyErr_Format(PyExc_RuntimeError, "kept_launch: %s failed: %s (CUDA error %d)",
                      what, text, code);
}

typedef struct {
  PyObject_HEAD
  CUfunction function;
  unsigned grid[3], block, shared;
  Py_ssize_t n_params, n_slots;
  uint64_t *cells;   /* one 8-byte cell per kernel parameter, the fixed values packed */
  Py_ssize_t *slot;  /* the parameter each per-call value fills */
  char *kind;        /* per slot: 'p' a tensor (or None: null), 'f' a float32 */
  PyObject *stream_of, *device;  /* stream_of(device): the current stream, as an int */
  int ordinal;                   /* the device's index, as an int */
} Launch;

static PyObject *data_ptr_name;

static void launch_dealloc(Launch *self) {
  PyMem_Free(self->cells);
  PyMem_Free(self->slot);
  PyMem_Free(self->kind);
  Py_XDECREF(self->stream_of);
  Py_XDECREF(self->device);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Launch(function, grid, block, shared, cells, sizes, slots, kinds, stream_of, device):
 * cells the packed parameters (8 bytes each), sizes each parameter's size in bytes (checked
 * against the driver's: a ValueError where they differ, or where it cannot tell), slots
 * and kinds the parameters filled in per call. */
static int launch_init(Launch *self, PyObject *args, PyObject *Py_UNUSED(kwargs)) {
  unsigned long long function;
  Py_buffer cells;
  PyObject *sizes, *slots, *stream_of, *device;
  const char *kinds;
  Py_ssize_t n_kinds;
  if (!PyArg_ParseTuple(args, "K(III)IIy*O!O!s#OO", &function, &self->grid[0],
                        &self->grid[1], &self->grid[2], &self->block, &self->shared, &cells,
                        &PyTuple_Type, &sizes, &PyTuple_Type, &slots, &kinds, &n_kinds,
                        &stream_of, &device))
    return -1;
  int status = -1;
  Py_ssize_t n = PyTuple_GET_SIZE(sizes);
  if (self->cells) {
    PyErr_SetString(PyExc_TypeError, "kept_launch: a Launch is made once");
    goto done;
  }
  if (cells.len != n * 8 || PyTuple_GET_SIZE(slots) != n_kinds || n > MAX_PARAMS) {
    PyErr_SetString(PyExc_ValueError, "kept_launch: cells, sizes, slots and kinds disagree "
                    "(or more than 64 parameters)");
    goto done;
  }
  if (load_driver() < 0) goto done;
  if (!cu_param_info) {  /* before CUDA 12.4 the layout cannot be checked: Triton's path */
    PyErr_SetString(PyExc_ValueError, "kept_launch: the driver cannot confirm the parameters");
    goto done;
  }
  self->function = (CUfunction)(uintptr_t)function;
  self->n_params = n;
  self->n_slots = n_kinds;
  self->cells = PyMem_Calloc(n ? n : 1, 8);
  self->slot = PyMem_Calloc(n_kinds ? n_kinds : 1, sizeof(Py_ssize_t));
  self->kind = PyMem_Calloc(n_kinds ? n_kinds : 1, 1);
  if (!self->cells || !self->slot || !self->kind) {
    PyErr_NoMemory();
    goto done;
  }
  memcpy(self->cells, cells.buf, cells.len);
  for (Py_ssize_t i = 0; i < n; i++) {
    size_t size = PyLong_AsSize_t(PyTuple_GET_ITEM(sizes, i));
    if (PyErr_Occurred()) goto done;
    size_t offset, driver_size;
    if (cu_param_info(self->function, i, &offset, &driver_size) != 0 || driver_size != size) {
      PyErr_Format(PyExc_ValueError, "kept_launch: parameter %zd is not %zu bytes to the "
                   "driver", i, size);
      goto done;
    }
  }
  size_t offset, driver_size;  /* one parameter more than packed: the layout is not known */
  if (cu_param_info(self->function, n, &offset, &driver_size) == 0) {
    PyErr_Format(PyExc_ValueError, "kept_launch: the kernel takes more than %zd parameters", n);
    goto done;
  }
  for (Py_ssize_t s = 0; s < n_kinds; s++) {
    Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(slots, s));
    if (PyErr_Occurred()) goto done;
    if (i < 0 || i >= n || (kinds[s] != 'p' && kinds[s] != 'f')) {
      PyErr_Format(PyExc_ValueError, "kept_launch: slot %zd (parameter %zd, kind %c) is not "
                   "a pointer or float32 parameter of this kernel", s, i, kinds[s]);
      goto done;
    }
    self->slot[s] = i;
    self->kind[s] = kinds[s];
  }
  self->ordinal = (int)PyLong_AsLong(device);
  if (PyErr_Occurred()) goto done;
  Py_INCREF(stream_of);
  Py_INCREF(device);
  self->stream_of = stream_of;
  self->device = device;
  status = 0;
done:
  PyBuffer_Release(&cells);
  return status;
}

/* Fill in the per-call values, already raw (a pointer, or a float32's bits, in the low
 * bytes of each), and launch on `stream`. Touches no Python object, so native code may call
 * it without the GIL (kept_backward.cpp does, from autograd's worker thread). Returns 0 or
 * the driver's error; `failed` names the call that gave it. */
static CUresult launch_raw(const Launch *self, const uint64_t *values, void *stream,
                           const char **failed) {
  uint64_t cells[MAX_PARAMS];
  void *params[MAX_PARAMS];  /* params[i] = &cells[i], what cuLaunchKernel reads */
  memcpy(cells, self->cells, self->n_params * sizeof *cells);
  for (Py_ssize_t i = 0; i < self->n_params; i++) params[i] = &cells[i];
  for (Py_ssize_t s = 0; s < self->n_slots; s++)
    memcpy(&cells[self->slot[s]], &values[s], self->kind[s] == 'f' ? sizeof(float) : 8);
  CUcontext context = NULL;
  CUresult code = cu_current_context(&context);
  if (code != 0) return *failed = "cuCtxGetCurrent", code;
  if (!context) {  /* a thread CUDA was not used on yet: the device's primary context */
    int device;
    if ((code = cu_device_get(&device, self->ordinal)) != 0)
      return *failed = "cuDeviceGet", code;
    if ((code = cu_primary_context(&context, device)) != 0)
      return *failed = "cuDevicePrimaryCtxRetain", code;
    if ((code = cu_set_context(context)) != 0) return *failed = "cuCtxSetCurrent", code;
  }
  code = cu_launch(self->function, self->grid[0], self->grid[1], self->grid[2], self->block,
                   1, 1, self->shared, (CUstream)stream, params, NULL);
  return *failed = "cuLaunchKernel", code;
}

/* run(*values): fill in the per-call parameters and launch on the current stream. */
static PyObject *launch_run(Launch *self, PyObject *const *values, Py_ssize_t n_values) {
  if (n_values != self->n_slots)
    return PyErr_Format(PyExc_TypeError, "kept_launch: run takes %zd values, %zd given",
                        self->n_slots, n_values);
  uint64_t raw[MAX_PARAMS] = {0};
  for (Py_ssize_t s = 0; s < n_values; s++) {
    PyObject *value = values[s];
    if (self->kind[s] == 'f') {
      float f = (float)PyFloat_AsDouble(value);
      if (f == -1.0f && PyErr_Occurred()) return NULL;
      memcpy(&raw[s], &f, sizeof f);
      continue;
    }
    Py_ssize_t earlier = 0;  /* a tensor passed twice (a wrapper's stand-in): asked once */
    while (earlier < s && (values[earlier] != value || self->kind[earlier] != 'p')) earlier++;
    if (earlier < s) {
      raw[s] = raw[earlier];
    } else if (value != Py_None) {
      PyObject *address = PyObject_CallMethodNoArgs(value, data_ptr_name);
      if (!address) return NULL;
      raw[s] = PyLong_AsUnsignedLongLong(address);
      Py_DECREF(address);
      if (raw[s] == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    }
  }
  PyObject *stream_obj = PyObject_CallOneArg(self->stream_of, self->device);
  if (!stream_obj) return NULL;
  uint64_t stream = PyLong_AsUnsignedLongLong(stream_obj);
  Py_DECREF(stream_obj);
  if (stream == (uint64_t)-1 && PyErr_Occurred()) return NULL;
  const char *failed = "";
  CUresult code = launch_raw(self, raw, (void *)(uintptr_t)stream, &failed);
  if (code != 0) return driver_error(failed, code);
  Py_RETURN_NONE;
}

static PyMethodDef launch_methods[] = {
    {"run", (PyCFunction)(void (*)(void))launch_run, METH_FASTCALL,
     "run(*values): fill in the per-call parameters and launch on the current stream"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kept_launch.Launch",
    .tp_basicsize = sizeof(Launch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A kernel launch with its fixed parameters packed once",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)launch_init,
    .tp_dealloc = (destructor)launch_dealloc,
    .tp_methods = launch_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "kept_launch", .m_size = -1};

PyMODINIT_FUNC PyInit_kept_launch(void) {
  data_ptr_name = PyUnicode_InternFromString("data_ptr");
  if (!data_ptr_name || PyType_Ready(&LaunchType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (!m) return NULL;
  Py_INCREF(&LaunchType);
  if (PyModule_AddObject(m, "Launch", (PyObject *)&LaunchType) < 0) {
    Py_DECREF(&LaunchType);
    Py_DECREF(m);
    return NULL;
  }
  /* launch_raw for native code: kept_backward.cpp takes it from this capsule */
  PyObject *raw = PyCapsule_New((void *)launch_raw, "kept_launch.launch_raw", NULL);
  if (!raw || PyModule_AddObject(m, "launch_raw", raw) < 0) {
    Py_XDECREF(raw);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
