#pragma once
#include "emu.h"
#include <algorithm>
#include <numeric>
namespace cub { struct DeviceRadixSort {
  template <class K, class V>
  static cudaError_t SortPairs(void *temp, size_t &bytes, const K *kin, K *kout, const V *vin, V *vout,
                               int n, int b0 = 0, int b1 = 32, cudaStream_t st = nullptr)
  {
      if (!temp) { bytes = 16; return cudaSuccess; }
      /* work on stream st: run now, or recorded in a capture */
      return emu_submit(st, "cub::DeviceRadixSort::SortPairs", [=]() {
          std::vector<int> idx(n);
          std::iota(idx.begin(), idx.end(), 0);
          std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return kin[a] < kin[b]; });
          std::vector<K> ko(n); std::vector<V> vo(n);
          for (int i = 0; i < n; i++) { ko[i] = kin[idx[i]]; vo[i] = vin[idx[i]]; }
          std::copy(ko.begin(), ko.end(), kout); std::copy(vo.begin(), vo.end(), vout);
      });
  }
}; }
