# Run by `cmake --install` (install(CODE) in WfInstall.cmake), where CMAKE_INSTALL_PREFIX is the
# prefix being installed to. Lays out deploy/systemd and the configuration; see WfInstall.cmake.
foreach(v WF_SRC WF_STAGE WF_BINDIR WF_SYSCONFDIR WF_SYSTEMD_UNITDIR WF_SYSUSERSDIR WF_TMPFILESDIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "WfInstallDeploy.cmake: ${v} is not set")
  endif()
endforeach()

function(wf_full out dir)
  if(IS_ABSOLUTE "${dir}")
    set(${out} "${dir}" PARENT_SCOPE)
  else()
    set(${out} "${CMAKE_INSTALL_PREFIX}/${dir}" PARENT_SCOPE)
  endif()
endfunction()
wf_full(bindir "${WF_BINDIR}")
# GNUInstallDirs' rule for the FULL directory: the prefix /usr keeps its configuration in /etc.
if(WF_SYSCONFDIR STREQUAL "etc" AND CMAKE_INSTALL_PREFIX MATCHES "^/usr/?$")
  set(etcdir "/etc")
else()
  wf_full(etcdir "${WF_SYSCONFDIR}")
endif()

# The units in the source name /usr/bin and /etc (where the Debian layout puts them), so that
# they can be read and checked as they are.
file(MAKE_DIRECTORY "${WF_STAGE}")
foreach(unit wf-agent.service wf-worker@.service dev-shm-weightfloor.mount)
  file(READ "${WF_SRC}/deploy/systemd/${unit}" text)
  string(REPLACE "/usr/bin/" "${bindir}/" text "${text}")
  string(REPLACE "/etc/weightfloor/" "${etcdir}/weightfloor/" text "${text}")
  file(WRITE "${WF_STAGE}/${unit}" "${text}")
  wf_full(d "${WF_SYSTEMD_UNITDIR}")
  file(INSTALL "${WF_STAGE}/${unit}" DESTINATION "${d}" FILE_PERMISSIONS OWNER_READ OWNER_WRITE
       GROUP_READ WORLD_READ)
endforeach()
wf_full(d "${WF_SYSUSERSDIR}")
file(INSTALL "${WF_SRC}/deploy/systemd/weightfloor.sysusers" DESTINATION "${d}" RENAME weightfloor.conf)
wf_full(d "${WF_TMPFILESDIR}")
file(INSTALL "${WF_SRC}/deploy/systemd/weightfloor.tmpfiles" DESTINATION "${d}" RENAME weightfloor.conf)
# The configuration the unit reads; 0644 as Debian ships conffiles (it holds no secret).
file(INSTALL "${WF_SRC}/docs/agent.json.example" DESTINATION "${etcdir}/weightfloor" RENAME agent.json)
