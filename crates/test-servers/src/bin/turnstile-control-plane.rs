//! `turnstile-control-plane DIR`: starts the tests' control plane with its files in `DIR`,
//! leaves it running, writes the PIDs to `DIR/pids` and prints the admin kubeconfig's path.
//! `scripts/control-plane.sh up` runs it; `down` stops the PIDs.

use std::path::PathBuf;
use std::process::ExitCode;

use test_servers::ControlPlane;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: turnstile-control-plane DIR");
        return ExitCode::from(2);
    };
    if let Err(error) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {error}", dir.display());
        return ExitCode::FAILURE;
    }
    match ControlPlane::start_in(dir.clone(), None) {
        Ok(plane) => {
            let kubeconfig = plane.kubeconfig().to_path_buf();
            let pids: Vec<String> = plane.detach().iter().map(u32::to_string).collect();
            if let Err(error) = std::fs::write(dir.join("pids"), pids.join("\n") + "\n") {
                eprintln!("cannot write {}/pids: {error}", dir.display());
                return ExitCode::FAILURE;
            }
            println!("{}", kubeconfig.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("the control plane did not start: {error}");
            ExitCode::FAILURE
        }
    }
}
