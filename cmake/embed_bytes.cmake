# embed_bytes.cmake — what the build's embedding scripts share (included in
# -P script mode by codegen/nvrtc/embed_kernels.cmake and
# compiler/calib/embed_text.cmake): a file's bytes as C initialiser text, and
# writing a generated file only when it changed, so dependents do not rebuild.

# kiln_bytes_c(FILE OUT_BYTES OUT_N): FILE's bytes as "0xAB," items, 32 a
# line, NUL-terminator not included, and their count.
function(kiln_bytes_c file out_bytes out_n)
  file(READ ${file} hex HEX)
  string(LENGTH "${hex}" hexlen)
  math(EXPR nbytes "${hexlen} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){32})" "\\1\n" bytes "${bytes}")
  set(${out_bytes} "${bytes}" PARENT_SCOPE)
  set(${out_n} ${nbytes} PARENT_SCOPE)
endfunction()

# kiln_write_if_changed(OUT BODY): write BODY to OUT unless OUT holds it already.
function(kiln_write_if_changed out body)
  if(EXISTS "${out}")
    file(READ "${out}" old)
    if(old STREQUAL body)
      return()
    endif()
  endif()
  file(WRITE "${out}" "${body}")
endfunction()
