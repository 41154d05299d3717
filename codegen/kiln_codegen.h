/*
 * kiln_codegen.h — IR after passes → engine sections.
 *
 * The plan (format/kiln_plan.h) is the graph flattened: live values renumbered
 * densely in id order, weights laid out in the weights section in that order,
 * each at a 256-byte aligned offset, converted to the weight's dtype.
 * Both functions walk the graph the same way, so the offsets the plan records
 * are the offsets the weights are written at.
 */
#ifndef KILN_CODEGEN_H
#define KILN_CODEGEN_H

#include "../ir/kiln_ir.h"
#include "../format/kiln_engine.h"

/* Serialize the plan of a verified, memory-planned graph. */
kiln_status kiln_plan_serialize(const kiln_graph *g, kiln_buf *out, kiln_error *err);

/* Stream the weights section's raw bytes (converted from each weight's
 * source dtype) into `w`, which has a section begun. Returns the byte count
 * through `size` (may be NULL). */
kiln_status kiln_weights_write(const kiln_graph *g, kiln_engine_writer *w, uint64_t *size, kiln_error *err);
/* The byte count kiln_weights_write will write (for progress reports). */
uint64_t kiln_weights_size(const kiln_graph *g);
/* The byte range [*begin, *end) of the weights section rank `rank`'s weights lie in (a graph split
 * by pass tensor-parallel; rank 0 of an unsplit graph: all of it). */
void kiln_weights_rank_range(const kiln_graph *g, int rank, uint64_t *begin, uint64_t *end);

/* Convert `count` elements of weight `v` starting at flat element `first`
 * from `src` (v->src_dtype bytes, little-endian, possibly unaligned) into
 * `dst` (v->dtype), checking each value: NaN or ±Inf (KILN_ERR_PARSE) and
 * a narrowing conversion that overflows to ±Inf (KILN_ERR_UNSUPPORTED) are
 * refused naming the tensor, the element and the value. Used by
 * kiln_weights_write; public for tests. */
kiln_status kiln_weight_convert(const kiln_value *v, uint64_t first, const uint8_t *src, uint8_t *dst, size_t count,
                                kiln_error *err);

#endif /* KILN_CODEGEN_H */
