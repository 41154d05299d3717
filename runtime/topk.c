/*
 * topk.c — the k largest of n floats in the order torch.topk returns them
 * on the CPU, ties included: the order Mixtral's router picks experts in.
 *
 * Why not "lowest index first": PyTorch's CPU topk (aten TopKImpl.h) puts
 * (value, index) pairs in an array and calls the C++ library's selection
 * algorithms with "a before b when a is NaN and b is not, or a > b", which
 * leaves equal values in whatever order the algorithm moves them to:
 *   k * 64 <= n:  std::partial_sort(first k)            (heap select, then heap sort)
 *   otherwise:    std::nth_element(k-1), then std::sort(first k-1)
 * torch.topk([0.25] * 8, 2) is [6, 5]. PyTorch's Linux wheels use GCC's
 * libstdc++, so this file carries the same algorithms written out in C (the
 * introselect of nth_element: median-of-three pivot, Hoare partition,
 * insertion sort below 4 elements, heap select past its depth limit; the
 * introsort of sort: the same partition down to 16 elements, then insertion
 * sort; the binary heap of partial_sort). Every step must move elements
 * exactly as there, or ties come out in another order: tests/test_golden.c
 * checks this file against torch.topk over inputs full of ties
 * (tests/golden/topk-ties, made by make_goldens.py).
 */
#include <math.h>
#include <stdlib.h>

#include "kiln_rt.h"

/* the selection steps, shared with the device's router (kernels/moe.cuh) */
#define KILN_TK_FN static inline
#include "../kernels/topk_order.cuh"

typedef kiln_tk tk_elem;

static void partial_sort(tk_elem *first, tk_elem *middle, tk_elem *last) {
    kiln_tk_heap_select(first, middle, last);
    kiln_tk_sort_heap(first, middle);
}

enum { TK_THRESHOLD = 16 };

static void introsort_loop(tk_elem *first, tk_elem *last, int depth) {
    while (last - first > TK_THRESHOLD) {
        if (depth == 0) {
            partial_sort(first, last, last);
            return;
        }
        depth--;
        tk_elem *cut = kiln_tk_partition_pivot(first, last);
        introsort_loop(cut, last, depth);
        last = cut;
    }
}

static void sort(tk_elem *first, tk_elem *last) {
    if (first == last) return;
    introsort_loop(first, last, kiln_tk_log2(last - first) * 2);
    if (last - first > TK_THRESHOLD) {
        kiln_tk_insertion_sort(first, first + TK_THRESHOLD);
        for (tk_elem *i = first + TK_THRESHOLD; i != last; i++) kiln_tk_linear_insert(i);
    } else {
        kiln_tk_insertion_sort(first, last);
    }
}

kiln_status kiln_topk(const float *v, int n, int k, int32_t *idx, kiln_error *err) {
    if (n <= 0 || k <= 0 || k > n) return kiln_err(err, KILN_ERR_INVALID_ARG, "topk: %d of %d values", k, n);
    tk_elem local[512]; /* a router's experts fit */
    tk_elem *q = n <= 512 ? local : malloc((size_t)n * sizeof *q);
    if (!q) return kiln_err(err, KILN_ERR_NOMEM, "topk: out of memory");
    for (int j = 0; j < n; j++) q[j] = (tk_elem){v[j], j};
    if ((int64_t)k * 64 <= n) {
        partial_sort(q, q + k, q + n);
    } else {
        kiln_tk_nth_element(q, q + k - 1, q + n);
        sort(q, q + k - 1);
    }
    for (int j = 0; j < k; j++) idx[j] = q[j].i;
    if (q != local) free(q);
    return KILN_OK;
}
