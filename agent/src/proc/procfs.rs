//! Reading `/proc`: the one place that parses `/proc/PID/stat`, used to count
//! processes, sum their CPU time and find a terminal's session, and that lists a
//! process's descendants (a session's shell, before each of its commands).

/// The fields of `/proc/PID/stat` the agent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// The process id.
    pub pid: i32,
    /// State letter (`R`, `S`, `Z`, ...).
    pub state: char,
    /// Parent pid.
    pub ppid: i32,
    /// Process group.
    pub pgrp: i32,
    /// Session id.
    pub session: i32,
    /// User plus system CPU time, in clock ticks.
    pub cpu_ticks: u64,
}

/// Parses one `/proc/PID/stat` line. The command name may hold spaces and parentheses,
/// so fields are counted from the last `)`.
pub fn parse_stat(pid: i32, line: &str) -> Option<Stat> {
    let after = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state): ppid 4, pgrp 5, session 6, utime 14, stime 15.
    let num = |i: usize| fields.get(i).and_then(|v| v.parse::<i64>().ok());
    Some(Stat {
        pid,
        state: fields.first()?.chars().next()?,
        ppid: num(1)? as i32,
        pgrp: num(2)? as i32,
        session: num(3)? as i32,
        cpu_ticks: (num(11).unwrap_or(0) + num(12).unwrap_or(0)).max(0) as u64,
    })
}

/// Every pid in `/proc`.
pub fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

/// `/proc/PID/stat` of one process, if it still exists.
pub fn stat(pid: i32) -> Option<Stat> {
    parse_stat(
        pid,
        &std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?,
    )
}

/// Every process's stat.
pub fn all() -> Vec<Stat> {
    pids().into_iter().filter_map(stat).collect()
}

/// Direct children of `pid`, from `/proc/PID/task/*/children` (one small read per
/// thread), or `None` where the kernel does not offer that file.
fn children(pid: i32) -> Option<Vec<i32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut out = Vec::new();
    let mut any = false;
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            any = true;
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    any.then_some(out)
}

/// Pids of every descendant of `root`. Cheap (it runs before every session command)
/// where the kernel lists children; a scan of all of /proc otherwise.
pub fn descendants(root: i32) -> Vec<i32> {
    if children(root).is_some() {
        let mut found = Vec::new();
        let mut queue = vec![root];
        while let Some(pid) = queue.pop() {
            for child in children(pid).unwrap_or_default() {
                if !found.contains(&child) {
                    found.push(child);
                    queue.push(child);
                }
            }
        }
        return found;
    }
    let parent_of: Vec<(i32, i32)> = all().iter().map(|p| (p.pid, p.ppid)).collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        for (pid, ppid) in &parent_of {
            if *ppid == parent && !found.contains(pid) {
                found.push(*pid);
            }
        }
        i += 1;
    }
    found.remove(0);
    found
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::proc::spawn::kill_one;

    use super::*;

    #[test]
    fn fields_are_counted_past_a_command_name_with_spaces_and_parens() {
        let line = "42 (my (odd) prog) S 1 40 39 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 100 0 0";
        let s = parse_stat(42, line).unwrap();
        assert_eq!(
            s,
            Stat {
                pid: 42,
                state: 'S',
                ppid: 1,
                pgrp: 40,
                session: 39,
                cpu_ticks: 12
            }
        );
    }

    #[test]
    fn this_process_is_found() {
        let me = std::process::id() as i32;
        assert!(pids().contains(&me));
        assert_eq!(stat(me).map(|s| s.pid), Some(me));
    }

    #[test]
    fn descendants_include_grandchildren() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & sleep 5 & wait"])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut found = descendants(pid);
        while found.len() < 2 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
            found = descendants(pid);
        }
        for p in &found {
            kill_one(*p, libc::SIGKILL);
        }
        kill_one(pid, libc::SIGKILL);
        let _ = child.wait();
        assert_eq!(found.len(), 2, "{found:?}");
    }
}
