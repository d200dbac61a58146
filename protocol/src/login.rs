//! Login shells as Orchard runs them (`login_shell: true` on an exec, a job or a PTY
//! init frame), and the stderr noise they produce that Orchard removes.
//!
//! SWE-bench-style images activate their environment from `~/.bashrc` (`conda activate
//! testbed`) *after* the usual guard that returns early in non-interactive shells. A
//! plain `bash -lc` never gets there. Orchard runs `bash --login -i -c` and sources
//! `~/.bashrc` itself before the command, so the guard passes and the activation takes
//! effect. An interactive shell without a terminal prints two harmless lines (no job
//! control), and a broken conda in `~/.bashrc` prints an import traceback; both are
//! filtered from the stderr the caller sees ([`filter_login_noise`]).
//!
//! Images without bash get a plain `sh -l -c`: `-i` there would only add noise that no
//! client expects, and `~/.bashrc` is bash's.

/// What runs before the command in a bash login shell: `~/.bashrc`, when it exists.
pub const BASHRC_PRELUDE: &str = "if [ -f ~/.bashrc ]; then . ~/.bashrc; fi\n";

/// True when `shell` (a path or a name) is bash.
pub fn is_bash(shell: &str) -> bool {
    shell.rsplit('/').next() == Some("bash")
}

/// The argv that runs `script` in a login shell of `shell`: `bash --login -i -c
/// '<bashrc prelude><script>'`, or `sh -l -c '<script>'` for any other shell.
pub fn login_shell_argv(shell: &str, script: &str) -> Vec<String> {
    if is_bash(shell) {
        vec![
            shell.to_string(),
            "--login".into(),
            "-i".into(),
            "-c".into(),
            format!("{BASHRC_PRELUDE}{script}"),
        ]
    } else {
        vec![
            shell.to_string(),
            "-l".into(),
            "-c".into(),
            script.to_string(),
        ]
    }
}

/// The argv of an interactive login shell with no command (a terminal).
pub fn login_shell_interactive_argv(shell: &str) -> Vec<String> {
    if is_bash(shell) {
        vec![shell.to_string(), "--login".into(), "-i".into()]
    } else {
        vec![shell.to_string(), "-l".into()]
    }
}

/// Lines of an interactive shell without a terminal that say nothing about the command.
const NOISE: [&str; 2] = [
    "cannot set terminal process group",
    "no job control in this shell",
];

/// Exceptions whose tracebacks come from a broken conda (or other Python tool) in
/// `~/.bashrc`, not from the command.
const IMPORT_ERRORS: [&str; 2] = ["ModuleNotFoundError", "ImportError"];

/// `stderr` without the noise of a login shell: lines containing
/// `cannot set terminal process group` or `no job control in this shell`, and Python
/// tracebacks that end in `ModuleNotFoundError` or `ImportError`. Everything else,
/// other tracebacks included, is kept byte for byte.
pub fn filter_login_noise(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.split_inclusive('\n').collect();
    let mut out = String::with_capacity(stderr.len());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if NOISE.iter().any(|n| line.contains(n)) {
            i += 1;
            continue;
        }
        if line.trim_end() == "Traceback (most recent call last):" {
            // The traceback's frames are indented; its first unindented line is the
            // exception (possibly followed by chained tracebacks, each its own block).
            let mut end = i + 1;
            while end < lines.len() && lines[end].starts_with([' ', '\t']) {
                end += 1;
            }
            let exception = lines.get(end).copied().unwrap_or("");
            if IMPORT_ERRORS
                .iter()
                .any(|e| exception.starts_with(&format!("{e}:")) || exception.trim_end() == *e)
            {
                i = end + 1;
                continue;
            }
        }
        out.push_str(line);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bash_gets_a_login_interactive_shell_that_sources_bashrc() {
        assert_eq!(
            login_shell_argv("/bin/bash", "echo hi"),
            [
                "/bin/bash",
                "--login",
                "-i",
                "-c",
                "if [ -f ~/.bashrc ]; then . ~/.bashrc; fi\necho hi"
            ]
        );
        assert_eq!(
            login_shell_argv("sh", "echo hi"),
            ["sh", "-l", "-c", "echo hi"]
        );
        assert_eq!(
            login_shell_interactive_argv("bash"),
            ["bash", "--login", "-i"]
        );
        assert_eq!(login_shell_interactive_argv("/bin/sh"), ["/bin/sh", "-l"]);
    }

    #[test]
    fn job_control_noise_is_removed_and_the_rest_kept() {
        let stderr =
            "bash: cannot set terminal process group (-1): Inappropriate ioctl for device\n\
                      bash: no job control in this shell\n\
                      real error\n\
                      last line without newline";
        assert_eq!(
            filter_login_noise(stderr),
            "real error\nlast line without newline"
        );
    }

    #[test]
    fn import_tracebacks_are_removed_other_tracebacks_kept() {
        let broken_conda = "Traceback (most recent call last):\n  File \"/opt/conda/bin/conda\", line 12, in <module>\n    from conda.cli import main\nModuleNotFoundError: No module named 'conda'\n";
        let import = "Traceback (most recent call last):\n  File \"x\", line 1\nImportError: cannot import name 'y'\n";
        let real = "Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n    1/0\nZeroDivisionError: division by zero\n";
        let stderr = format!("before\n{broken_conda}{import}{real}after\n");
        assert_eq!(
            filter_login_noise(&stderr),
            format!("before\n{real}after\n")
        );
        // A lone "Traceback" line with nothing after it is kept.
        assert_eq!(
            filter_login_noise("Traceback (most recent call last):\n"),
            "Traceback (most recent call last):\n"
        );
        // Not an import error although it mentions one.
        let other = "Traceback (most recent call last):\n  File \"a\"\nValueError: ImportError\n";
        assert_eq!(filter_login_noise(other), other);
        assert_eq!(filter_login_noise(""), "");
    }
}
