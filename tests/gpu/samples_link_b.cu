// Relocatable PTX unit B of the culink sample: the device function unit A calls.
extern "C" __device__ float samples_link_scale(float x, int i) { return 3.0f * x + static_cast<float>(i % 5); }
