/*
 * topk_order.cuh — the C++ library's selection steps that torch.topk takes on
 * the CPU, written once for the host (runtime/topk.c: kiln_topk, the CPU
 * executor's router) and the device (kernels/moe.cuh: kiln_moe_route): the
 * two must move elements identically, or tied router logits pick other
 * experts on the GPU than on the CPU and in HF. runtime/topk.c's header says
 * which algorithms and why; tests/test_golden.c checks the host against
 * torch.topk over inputs full of ties, test_gpu_kernels the device against
 * the host.
 *
 * Plain C that is also CUDA C++: the includer defines KILN_TK_FN, the
 * qualifiers of every function here (host: static inline; device: static
 * __device__ __forceinline__), and has isnan. An element is a value and its
 * index; "a before b" is torch's comparator (a is NaN and b is not, or a > b).
 */
#ifndef KILN_TOPK_ORDER_CUH
#define KILN_TOPK_ORDER_CUH

#ifndef KILN_TK_FN
#error "topk_order.cuh: define KILN_TK_FN (the functions' qualifiers) first"
#endif

typedef struct kiln_tk {
    float v;
    int i;
} kiln_tk;

KILN_TK_FN int kiln_tk_before(kiln_tk a, kiln_tk b) { return (isnan(a.v) && !isnan(b.v)) || a.v > b.v; }

KILN_TK_FN void kiln_tk_swap(kiln_tk *a, kiln_tk *b) {
    kiln_tk t = *a;
    *a = *b;
    *b = t;
}

KILN_TK_FN int kiln_tk_log2(long n) {
    int k = 0;
    while (n > 1) {
        n >>= 1;
        k++;
    }
    return k;
}

/* ---- binary heap (the top is the element every other goes after) ---- */

KILN_TK_FN void kiln_tk_push_heap(kiln_tk *first, long hole, long top, kiln_tk val) {
    long parent = (hole - 1) / 2;
    while (hole > top && kiln_tk_before(first[parent], val)) {
        first[hole] = first[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    first[hole] = val;
}

KILN_TK_FN void kiln_tk_adjust_heap(kiln_tk *first, long hole, long len, kiln_tk val) {
    const long top = hole;
    long child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (kiln_tk_before(first[child], first[child - 1])) child--;
        first[hole] = first[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        first[hole] = first[child - 1];
        hole = child - 1;
    }
    kiln_tk_push_heap(first, hole, top, val);
}

KILN_TK_FN void kiln_tk_make_heap(kiln_tk *first, kiln_tk *last) {
    long len = last - first;
    if (len < 2) return;
    for (long parent = (len - 2) / 2;; parent--) {
        kiln_tk_adjust_heap(first, parent, len, first[parent]);
        if (parent == 0) return;
    }
}

/* Move the top to *result and put *result's old value into the heap [first, last). */
KILN_TK_FN void kiln_tk_pop_heap(kiln_tk *first, kiln_tk *last, kiln_tk *result) {
    kiln_tk val = *result;
    *result = *first;
    kiln_tk_adjust_heap(first, 0, last - first, val);
}

KILN_TK_FN void kiln_tk_heap_select(kiln_tk *first, kiln_tk *middle, kiln_tk *last) {
    kiln_tk_make_heap(first, middle);
    for (kiln_tk *i = middle; i < last; i++)
        if (kiln_tk_before(*i, *first)) kiln_tk_pop_heap(first, middle, i);
}

KILN_TK_FN void kiln_tk_sort_heap(kiln_tk *first, kiln_tk *last) {
    while (last - first > 1) {
        last--;
        kiln_tk_pop_heap(first, last, last);
    }
}

/* ---- partitioning and insertion sort ---- */

KILN_TK_FN void kiln_tk_move_median_to_first(kiln_tk *result, kiln_tk *a, kiln_tk *b, kiln_tk *c) {
    if (kiln_tk_before(*a, *b)) {
        if (kiln_tk_before(*b, *c)) kiln_tk_swap(result, b);
        else if (kiln_tk_before(*a, *c)) kiln_tk_swap(result, c);
        else kiln_tk_swap(result, a);
    } else if (kiln_tk_before(*a, *c)) {
        kiln_tk_swap(result, a);
    } else if (kiln_tk_before(*b, *c)) {
        kiln_tk_swap(result, c);
    } else {
        kiln_tk_swap(result, b);
    }
}

KILN_TK_FN kiln_tk *kiln_tk_unguarded_partition(kiln_tk *first, kiln_tk *last, const kiln_tk *pivot) {
    for (;;) {
        while (kiln_tk_before(*first, *pivot)) first++;
        last--;
        while (kiln_tk_before(*pivot, *last)) last--;
        if (!(first < last)) return first;
        kiln_tk_swap(first, last);
        first++;
    }
}

KILN_TK_FN kiln_tk *kiln_tk_partition_pivot(kiln_tk *first, kiln_tk *last) {
    kiln_tk *mid = first + (last - first) / 2;
    kiln_tk_move_median_to_first(first, first + 1, mid, last - 1);
    return kiln_tk_unguarded_partition(first + 1, last, first);
}

KILN_TK_FN void kiln_tk_linear_insert(kiln_tk *last) {
    kiln_tk val = *last;
    kiln_tk *next = last - 1;
    while (kiln_tk_before(val, *next)) {
        *last = *next;
        last = next;
        next--;
    }
    *last = val;
}

KILN_TK_FN void kiln_tk_insertion_sort(kiln_tk *first, kiln_tk *last) {
    if (first == last) return;
    for (kiln_tk *i = first + 1; i != last; i++) {
        if (kiln_tk_before(*i, *first)) {
            kiln_tk val = *i;
            for (kiln_tk *p = i; p != first; p--) p[0] = p[-1];
            *first = val;
        } else {
            kiln_tk_linear_insert(i);
        }
    }
}

/* ---- nth_element (introselect) ---- */

KILN_TK_FN void kiln_tk_nth_element(kiln_tk *first, kiln_tk *nth, kiln_tk *last) {
    if (first == last || nth == last) return;
    int depth = kiln_tk_log2(last - first) * 2;
    while (last - first > 3) {
        if (depth == 0) {
            kiln_tk_heap_select(first, nth + 1, last);
            kiln_tk_swap(first, nth); /* the nth element in its place */
            return;
        }
        depth--;
        kiln_tk *cut = kiln_tk_partition_pivot(first, last);
        if (cut <= nth) first = cut;
        else last = cut;
    }
    kiln_tk_insertion_sort(first, last);
}

#endif /* KILN_TOPK_ORDER_CUH */
