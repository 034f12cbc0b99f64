//! A peer process spoken to one line at a time: a command on its stdin, its answer on
//! its stdout (the C++ peers of tests/rosidl_cuda/).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};

/// The peer's process; killed when dropped.
pub struct LinePeer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl LinePeer {
    /// Starts `bin` with `args` and `env`, its stderr inherited.
    ///
    /// # Panics
    /// When it cannot be started.
    pub fn start(bin: &Path, args: &[String], env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(bin);
        cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Self { child, stdin, stdout }
    }

    /// Its next line, without the line end.
    ///
    /// # Panics
    /// When it has exited instead.
    pub fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("the peer's answer");
        assert!(!line.is_empty(), "the peer exited: {:?}", self.child.try_wait());
        line.trim_end().to_owned()
    }

    /// Sends `cmd` and returns the answer.
    pub fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("the peer's stdin");
        self.line()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `exit` and waits for the process.
    pub fn exit(mut self) -> ExitStatus {
        writeln!(self.stdin, "exit").expect("the peer's stdin");
        self.child.wait().expect("wait for the peer")
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LinePeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
