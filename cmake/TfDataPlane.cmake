# Libraries that load into a tenant's process (limiter, client stub) follow the guest rules:
# no exceptions, hidden visibility, only the driver/NVML entry points exported, libstdc++
# linked statically so the host process's C++ runtime never matters, and nothing beyond libc
# (the real driver is loaded with dlopen).
function(tf_data_plane_library target version_script)
  target_compile_options(${target} PRIVATE -fno-exceptions -fvisibility=hidden
                         -fvisibility-inlines-hidden -fno-rtti)
  target_link_options(${target} PRIVATE -static-libstdc++ -static-libgcc
                      -Wl,--version-script=${version_script} -Wl,--no-undefined -Wl,-z,defs)
  set_target_properties(${target} PROPERTIES LINK_DEPENDS ${version_script})
  target_link_libraries(${target} PRIVATE ${CMAKE_DL_LIBS} Threads::Threads)
endfunction()
