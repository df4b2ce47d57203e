# cmake -DMD2MAN=... -DMD=page.md -DROFF=page.N -DNAME=page -DSECTION=N -DVERSION=x.y.z -P WfManPage.cmake
#
# Turns one of docs/man/*.md into a roff man page. The markdown stays the readable source: it opens
# with "# page(N)" for people browsing the repository, which becomes the .TH title block here, and
# the NAME line's em dash becomes the "name - summary" form that whatis and apropos parse.
foreach(v MD2MAN MD ROFF NAME SECTION VERSION)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "WfManPage.cmake: ${v} is not set")
  endif()
endforeach()
file(READ "${MD}" md)
string(REGEX REPLACE "^# [^\n]*\n" "" md "${md}")
string(REGEX REPLACE "(## NAME\n[^\n]*) — " "\\1 - " md "${md}")
string(TOUPPER "${NAME}" title)
# No date: the page is the same bytes on every build of one version.
file(WRITE "${ROFF}.md" "% ${title} ${SECTION} \"\" \"weightfloor ${VERSION}\" \"weightfloor manual\"\n${md}")
execute_process(COMMAND "${MD2MAN}" -in "${ROFF}.md" -out "${ROFF}" RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  file(REMOVE "${ROFF}")
  message(FATAL_ERROR "go-md2man failed on ${MD}: ${err}")
endif()
file(REMOVE "${ROFF}.md")
