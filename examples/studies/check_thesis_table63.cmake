# example.study_thesis_table63: `qkgeom study` on the thesis' Table 6.3 (seed
# file 001, Table 1: seven models given by their published numbers, with
# LongBench-Pro scores). The rank correlations equal the values computed by
# hand from the table (tests/runtime/study_test.cpp shows the arithmetic):
# ap_drop vs LBP Spearman -9/14, Kendall -13/21 with exact p 348/5040;
# bias_strength (a three-way tie) Spearman -8/sqrt(728).
file(REMOVE_RECURSE "${OUT}")
execute_process(COMMAND "${QKGEOM}" study "${STUDY}" -o "${OUT}" --quiet
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "qkgeom study failed (${rc}):\n${out}\n${err}")
endif()
file(STRINGS "${OUT}/study_correlations.csv" lines)
list(GET lines 0 header)
if(NOT header STREQUAL "metric,benchmark,group,n,pearson,p_pearson,spearman,p_spearman,kendall,p_kendall,p_method")
  message(FATAL_ERROR "study_correlations.csv header: ${header}")
endif()
# expect(metric group column lo hi): the row's column lies in (lo, hi).
function(expect metric group column lo hi)
  set(cols metric benchmark group n pearson p_pearson spearman p_spearman kendall p_kendall p_method)
  list(FIND cols "${column}" at)
  foreach(l ${lines})
    if(l MATCHES "^${metric},LBP,${group},")
      string(REPLACE "," ";" f "${l}")
      list(GET f ${at} got)
      if(NOT (got GREATER "${lo}" AND got LESS "${hi}"))
        message(FATAL_ERROR "${metric} / ${group}: ${column} = ${got}, expected in (${lo}, ${hi})")
      endif()
      message(STATUS "${metric} / ${group}: ${column} = ${got}")
      return()
    endif()
  endforeach()
  message(FATAL_ERROR "no ${metric} / ${group} row in study_correlations.csv")
endfunction()
expect(ap_drop all n 6.5 7.5)
expect(ap_drop all spearman -0.642857143 -0.642857142)   # -9/14
expect(ap_drop all kendall -0.619047620 -0.619047619)    # -13/21
expect(ap_drop all p_kendall 0.069047619 0.069047620)    # 348/5040
expect(bias_strength all spearman -0.296499727 -0.296499726)  # -8/sqrt(728)
expect(ap_drop qwen kendall -1.000000001 -0.999999999)
expect(ap_drop ministral spearman -0.500000001 -0.499999999)
foreach(f index.html study_models.csv study_scatter_ap_drop_lbp.svg)
  if(NOT EXISTS "${OUT}/${f}")
    message(FATAL_ERROR "qkgeom study did not write ${OUT}/${f}")
  endif()
endforeach()
