//! The `nisse` command. See `nisse --help`.

use clap::Parser as _;

fn main() -> std::process::ExitCode {
    let cli = nisse::cli::Cli::parse();
    let service = match &cli.command {
        nisse::cli::Command::Serve { services, .. } => format!("nisse-{}", services.join("+")),
        _ => "nisse".to_string(),
    };
    let telemetry = match nisse::telemetry::init(&service) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(nisse::cli::run(cli));
    drop(telemetry);
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
