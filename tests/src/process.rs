//! Running the `swiftlet` binary under test: its output lines arrive on channels so a test can
//! wait for one with a bound, and the process is killed when the guard goes out of scope.

use std::{
    io::{BufRead as _, BufReader, Read},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
};

use crate::event_wait;

pub struct Running {
    pub child: Child,
    pub stdout: mpsc::Receiver<String>,
    pub stderr: mpsc::Receiver<String>,
}

impl Running {
    /// Starts `command` with stdout and stderr piped line by line.
    pub fn start(command: &mut Command) -> Running {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
        let stdout = lines(child.stdout.take().expect("piped stdout"));
        let stderr = lines(child.stderr.take().expect("piped stderr"));
        Running {
            child,
            stdout,
            stderr,
        }
    }

    /// Waits for a stderr line containing `needle` (e.g. a readiness log line).
    pub fn wait_stderr(&self, needle: &str) -> String {
        wait_line(&self.stderr, needle, "stderr").0
    }

    /// Waits for a stderr line containing `needle`; every line up to it, that one last.
    pub fn wait_stderr_lines(&self, needle: &str) -> Vec<String> {
        let (line, mut seen) = wait_line(&self.stderr, needle, "stderr");
        seen.push(line);
        seen
    }

    /// Waits for a stdout line matching `want`.
    pub fn wait_stdout(&self, mut want: impl FnMut(&str) -> bool) -> String {
        let mut seen = Vec::new();
        loop {
            match self.stdout.recv_timeout(event_wait()) {
                Ok(line) if want(&line) => return line,
                Ok(line) => seen.push(line),
                Err(e) => panic!("no matching stdout line ({e}); saw {seen:#?}"),
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The line containing `needle`, and the lines before it.
fn wait_line(rx: &mpsc::Receiver<String>, needle: &str, what: &str) -> (String, Vec<String>) {
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(event_wait()) {
            Ok(line) if line.contains(needle) => return (line, seen),
            Ok(line) => seen.push(line),
            Err(e) => panic!("no {what} line containing {needle:?} ({e}); saw {seen:#?}"),
        }
    }
}

fn lines(stream: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}
