# Install layout (GNUInstallDirs; `cmake --install build --prefix P`):
#   P/bin/{wf-agent,wf-worker,agentctl,wf-gen,wf-bench}
#   P/share/man/man1/agentctl.1, P/share/man/man8/{wf-agent,wf-worker}.8   (from docs/man/*.md)
#   P/share/bash-completion/completions/agentctl, P/share/zsh/vendor-completions/_agentctl
#   P/share/doc/weightfloor/agent.json.example
install(TARGETS wf-agent wf-worker agentctl wf-gen wf-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

if(WF_MAN_PAGES)
  find_program(GO_MD2MAN go-md2man)
  if(NOT GO_MD2MAN)
    message(FATAL_ERROR "go-md2man not found: run scripts/setup.sh (Debian package go-md2man), "
                        "or configure with -DWF_MAN_PAGES=OFF to build without man pages")
  endif()
  set(WF_MAN_DIR ${PROJECT_BINARY_DIR}/man)
  set(wf_man_outputs)
  foreach(page agentctl:1 wf-agent:8 wf-worker:8)
    string(REPLACE ":" ";" parts ${page})
    list(GET parts 0 name)
    list(GET parts 1 section)
    set(src ${PROJECT_SOURCE_DIR}/docs/man/${name}.md)
    set(out ${WF_MAN_DIR}/${name}.${section})
    add_custom_command(
      OUTPUT ${out}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${WF_MAN_DIR}
      COMMAND ${CMAKE_COMMAND} -DMD2MAN=${GO_MD2MAN} -DMD=${src} -DROFF=${out} -DNAME=${name}
              -DSECTION=${section} -DVERSION=${PROJECT_VERSION} -P ${PROJECT_SOURCE_DIR}/cmake/WfManPage.cmake
      DEPENDS ${src} ${PROJECT_SOURCE_DIR}/cmake/WfManPage.cmake
      COMMENT "man page ${name}(${section})"
      VERBATIM)
    list(APPEND wf_man_outputs ${out})
    install(FILES ${out} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section})
  endforeach()
  add_custom_target(man ALL DEPENDS ${wf_man_outputs})
endif()

install(FILES ${PROJECT_SOURCE_DIR}/completions/agentctl.bash
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME agentctl)
install(FILES ${PROJECT_SOURCE_DIR}/completions/_agentctl
        DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/vendor-completions)
install(FILES ${PROJECT_SOURCE_DIR}/docs/agent.json.example DESTINATION ${CMAKE_INSTALL_DOCDIR})

# systemd units, sysusers and tmpfiles (deploy/systemd, docs/DEPLOY.md), where Debian puts them:
#   P/lib/systemd/system/{wf-agent.service,wf-worker@.service,dev-shm-weightfloor.mount}
#   P/lib/sysusers.d/weightfloor.conf, P/lib/tmpfiles.d/weightfloor.conf
#   SYSCONFDIR/weightfloor/agent.json (SYSCONFDIR: /etc for the prefix /usr, else P/etc, or
#   -DCMAKE_INSTALL_SYSCONFDIR as given)
# Done at install time (cmake/WfInstallDeploy.cmake), so that `cmake --install --prefix P` gets
# units that start P's binaries with P's configuration.
set(WF_SYSTEMD_UNITDIR "lib/systemd/system" CACHE STRING "systemd system units, relative to the prefix")
set(WF_SYSUSERSDIR "lib/sysusers.d" CACHE STRING "sysusers.d, relative to the prefix")
set(WF_TMPFILESDIR "lib/tmpfiles.d" CACHE STRING "tmpfiles.d, relative to the prefix")
install(CODE "
  set(WF_SRC \"${PROJECT_SOURCE_DIR}\")
  set(WF_STAGE \"${PROJECT_BINARY_DIR}/deploy-stage\")
  set(WF_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
  set(WF_SYSCONFDIR \"${CMAKE_INSTALL_SYSCONFDIR}\")
  set(WF_SYSTEMD_UNITDIR \"${WF_SYSTEMD_UNITDIR}\")
  set(WF_SYSUSERSDIR \"${WF_SYSUSERSDIR}\")
  set(WF_TMPFILESDIR \"${WF_TMPFILESDIR}\")
  include(\"${PROJECT_SOURCE_DIR}/cmake/WfInstallDeploy.cmake\")")
