//! A child's process group, killed when dropped: shared by the manifest's command tools
//! and MCP's stdio servers (a leaf, so neither imports the other).

/// A tool's process group, killed (with `SIGKILL`) when this is dropped: a tool's
/// background processes never outlive its call. Holds the group leader's pid, which is
/// the group's id; `None` once the child was reaped before its id was read. (An MCP
/// server's group lives as long as its session.)
pub(crate) struct ProcessGroup(pub(crate) Option<u32>);

impl ProcessGroup {
    pub(crate) fn kill(&self) {
        #[cfg(unix)]
        if let Some(pid) = self
            .0
            .and_then(|pid| i32::try_from(pid).ok())
            .and_then(rustix::process::Pid::from_raw)
        {
            // The group may be gone already (every member exited): nothing to do then.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}
