# Fails unless README contains EXAMPLE's text verbatim (comments included).
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "${example}" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "README.md does not contain ${EXAMPLE} verbatim; update the usage example")
endif()
