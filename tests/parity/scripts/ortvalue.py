"""OrtValue."""

import numpy as np
import onnxruntime as ort

a = np.arange(6, dtype=np.float32).reshape(2, 3)
v = ort.OrtValue.ortvalue_from_numpy(a)
print("shape:", v.shape())
print("data_type:", v.data_type())
print("element_type:", v.element_type())
print("device:", v.device_name())
print("is_tensor:", v.is_tensor(), "has_value:", v.has_value(), "sparse:", v.is_sparse_tensor())
print("bytes:", v.tensor_size_in_bytes())
print("values:", v.numpy().tolist())
a[0, 0] = 42
print("shares memory:", v.numpy()[0, 0] == 42)
print("data_ptr:", v.data_ptr() == a.ctypes.data)
e = ort.OrtValue.ortvalue_from_shape_and_type([3, 2], np.int64, "cpu", 0)
print("empty:", e.shape(), e.data_type(), e.numpy().dtype)
e.update_inplace(np.ones((3, 2), np.int64))
print("update_inplace:", e.numpy().tolist())
for dt in (np.float64, np.int32, np.uint8, np.bool_, np.float16, np.int8):
    print(f"type {np.dtype(dt).name}:", ort.OrtValue.ortvalue_from_numpy(np.zeros(2, dt)).data_type())
