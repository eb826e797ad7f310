//! `tally project …`: projects and their API keys, over the
//! witness's admin routes (docs/api.md "Projects"). Also the small HTTP
//! client ([`Remote`]) the other witness-side commands share: the redb files
//! are single-process, so the CLI talks to the running `tally serve`.

use super::out::outln;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};
use tally_schemas::api::{
    ApiBody, ApiKeyRevoked, CreateProjectRequest, ErrorBody, ErrorBodyError, NewApiKey, ProjectList,
};
use tally_schemas::display::escape;
use tally_schemas::limits::MAX_WIRE_OBJECT_BYTES;

/// Where the witness is and how to authenticate with a project's API key.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RemoteArgs {
    /// The witness's base URL.
    #[arg(
        long = "witness",
        env = "TALLY_WITNESS_URL",
        default_value = "http://127.0.0.1:7878"
    )]
    pub witness: String,
    /// The project's API key.
    #[arg(long, env = "TALLY_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

impl RemoteArgs {
    /// A client with the API key.
    ///
    /// # Errors
    /// When no API key is given.
    pub(crate) fn remote(&self) -> anyhow::Result<Remote> {
        let key = self
            .api_key
            .clone()
            .ok_or_else(|| anyhow!("give the project's API key with --api-key or TALLY_API_KEY"))?;
        let given = std::env::args().any(|a| a == "--api-key" || a.starts_with("--api-key="));
        let hint = if given {
            "the API key given with --api-key is not a current key of any project there: give the key `tally serve` printed on its first start, or make one with `tally project new-key PROJECT`".to_owned()
        } else {
            "the API key from TALLY_API_KEY is not a current key of any project there: set it to the key `tally serve` printed on its first start (for this witness), or give one with --api-key".to_owned()
        };
        Ok(Remote::new(&self.witness, Some(key))?.with_unauthorized_hint(hint))
    }

    /// A client that reads with `read_token` when one is given (any agent
    /// the log holds, docs/api.md "Exports"), else with the API key.
    ///
    /// # Errors
    /// When neither is given.
    pub(crate) fn reader(&self, read_token: Option<&str>) -> anyhow::Result<Remote> {
        match read_token {
            Some(t) => Remote::new(&self.witness, Some(t.trim().to_owned())),
            None => self.remote().map_err(|_| {
                anyhow!("give the project's API key (--api-key, TALLY_API_KEY) or a read token (--read-token, TALLY_READ_TOKEN)")
            }),
        }
    }
}

/// Where the admin token is.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct AdminArgs {
    /// The witness's base URL.
    #[arg(
        long = "witness",
        env = "TALLY_WITNESS_URL",
        default_value = "http://127.0.0.1:7878"
    )]
    pub witness: String,
    /// The admin token; by default read from <data-dir>/admin.token.
    #[arg(long, env = "TALLY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// The witness's data folder (to read admin.token from).
    #[arg(long, env = "TALLY_DATA_DIR", default_value = "./tally-data")]
    pub data_dir: PathBuf,
}

impl AdminArgs {
    /// A client with the admin token.
    ///
    /// # Errors
    /// When the token is not given and cannot be read from the data folder.
    pub(crate) fn remote(&self) -> anyhow::Result<Remote> {
        let token = match &self.admin_token {
            Some(t) => t.clone(),
            None => {
                let path = self
                    .data_dir
                    .join(tally_witness::server::files::ADMIN_TOKEN);
                std::fs::read_to_string(&path)
                    .with_context(|| {
                        format!(
                            "reading the admin token from {} (or give --admin-token)",
                            path.display()
                        )
                    })?
                    .trim()
                    .to_owned()
            }
        };
        Remote::new(&self.witness, Some(token))
    }
}

/// A blocking HTTP client for the witness's routes.
#[derive(Debug)]
pub(crate) struct Remote {
    base: String,
    bearer: Option<String>,
    /// What to say after a 401: which credential was refused and what to do.
    unauthorized_hint: Option<String>,
    http: reqwest::Client,
    rt: tokio::runtime::Runtime,
}

impl Remote {
    /// A client for `base`, sending `bearer` as `Authorization: Bearer`.
    ///
    /// # Errors
    /// When the runtime or client cannot be built.
    pub(crate) fn new(base: &str, bearer: Option<String>) -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .context("building the HTTP client")?;
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            bearer,
            unauthorized_hint: None,
            http,
            rt,
        })
    }

    fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
    ) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .query(query);
        if let Some(b) = &self.bearer {
            r = r.bearer_auth(b);
        }
        r
    }

    /// Says `hint` after a `401 unauthorized` answer.
    #[must_use]
    pub(crate) fn with_unauthorized_hint(mut self, hint: String) -> Self {
        self.unauthorized_hint = Some(hint);
        self
    }

    /// The answer when it is a success; else the witness's refusal as an
    /// error, read with [`ErrorBody::from_json`] (docs/api.md "Errors").
    async fn check(&self, resp: reqwest::Response) -> anyhow::Result<reqwest::Response> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = read_bounded(resp, MAX_WIRE_OBJECT_BYTES)
            .await
            .unwrap_or_default();
        let refused = refusal(status.as_u16(), &body);
        match &self.unauthorized_hint {
            Some(hint) if status == reqwest::StatusCode::UNAUTHORIZED => {
                Err(anyhow!("{refused}; {hint} (the witness at {})", self.base))
            }
            _ => Err(refused),
        }
    }

    /// Sends `request` and reads the answer as `T`, strictly (docs/api.md
    /// "Conventions": exactly the members listed).
    async fn answer<T: ApiBody>(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> anyhow::Result<T> {
        let resp = request
            .send()
            .await
            .with_context(|| format!("reaching the witness at {}", self.base))?;
        let resp = self.check(resp).await?;
        let body = read_bounded(resp, T::LIMITS.max_bytes)
            .await
            .with_context(|| format!("reading the witness's answer to {what}"))?;
        T::from_json(&body).with_context(|| format!("the witness's answer to {what}"))
    }

    /// GET an answer of the API.
    ///
    /// # Errors
    /// Transport errors, refusals (with the witness's code and message), an
    /// answer that is not a `T`.
    pub(crate) fn get<T: ApiBody>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> anyhow::Result<T> {
        self.rt.block_on(self.answer(
            self.request(reqwest::Method::GET, path, query),
            &format!("GET {path}"),
        ))
    }

    /// POST `body` as JSON and read the answer.
    ///
    /// # Errors
    /// As [`Remote::get`].
    pub(crate) fn post<B: ApiBody, T: ApiBody>(&self, path: &str, body: &B) -> anyhow::Result<T> {
        self.rt.block_on(self.answer(
            self.request(reqwest::Method::POST, path, &[]).json(body),
            &format!("POST {path}"),
        ))
    }

    /// POST without a body (the routes that take none) and read the answer.
    ///
    /// # Errors
    /// As [`Remote::get`].
    pub(crate) fn post_empty<T: ApiBody>(&self, path: &str) -> anyhow::Result<T> {
        self.rt.block_on(self.answer(
            self.request(reqwest::Method::POST, path, &[]),
            &format!("POST {path}"),
        ))
    }

    /// GET a document and stream it to `out` (`-` for stdout), through a
    /// temporary file renamed only once the whole body arrived. Without
    /// `overwrite`, an existing `out` is refused, also one that appeared
    /// while the body arrived.
    ///
    /// # Errors
    /// Transport errors (including a body cut short), refusals, I/O, an
    /// existing file.
    pub(crate) fn download(
        &self,
        path: &str,
        query: &[(&str, String)],
        out: &Path,
        overwrite: bool,
    ) -> anyhow::Result<u64> {
        self.download_with_headers(path, query, out, overwrite)
            .map(|(n, _)| n)
    }

    /// [`Remote::download`], also returning the answer's headers.
    ///
    /// # Errors
    /// As [`Remote::download`].
    pub(crate) fn download_with_headers(
        &self,
        path: &str,
        query: &[(&str, String)],
        out: &Path,
        overwrite: bool,
    ) -> anyhow::Result<(u64, reqwest::header::HeaderMap)> {
        self.rt.block_on(async {
            let mut resp = self
                .request(reqwest::Method::GET, path, query)
                .send()
                .await
                .with_context(|| format!("reaching the witness at {}", self.base))?;
            resp = self.check(resp).await?;
            let headers = resp.headers().clone();
            let to_stdout = out == Path::new("-");
            let tmp = out.with_extension("partial");
            let mut sink: Box<dyn std::io::Write> = if to_stdout {
                Box::new(super::out::stdout())
            } else {
                Box::new(std::io::BufWriter::new(
                    std::fs::File::create(&tmp)
                        .with_context(|| format!("creating {}", tmp.display()))?,
                ))
            };
            let mut n = 0u64;
            loop {
                let chunk = match resp.chunk().await {
                    Ok(Some(c)) => c,
                    Ok(None) => break,
                    Err(e) => {
                        drop(sink);
                        if !to_stdout {
                            let _ = std::fs::remove_file(&tmp);
                        }
                        return Err(anyhow!(e).context("the witness's answer was cut short"));
                    }
                };
                sink.write_all(&chunk)?;
                n += chunk.len() as u64;
            }
            sink.flush()?;
            drop(sink);
            if !to_stdout {
                if overwrite {
                    std::fs::rename(&tmp, out)
                        .with_context(|| format!("writing {}", out.display()))?;
                } else {
                    // A link fails where the file exists; a rename would replace it.
                    let linked = std::fs::hard_link(&tmp, out);
                    let _ = std::fs::remove_file(&tmp);
                    match linked {
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                            return Err(exists(out));
                        }
                        other => other.with_context(|| format!("writing {}", out.display()))?,
                    }
                }
            }
            Ok((n, headers))
        })
    }
}

/// Reads an answer's body, refusing one over `max` bytes.
///
/// # Errors
/// Transport errors, a body over `max`.
pub(crate) async fn read_bounded(
    mut resp: reqwest::Response,
    max: usize,
) -> anyhow::Result<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() + chunk.len() > max {
            bail!("the answer is larger than {max} bytes");
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The error for a refusal with HTTP `status` and `body`: the witness's
/// code and message (escaped for the terminal, protocol.md §11.2), or the
/// status and the start of the body when it is not an error body.
#[must_use]
pub(crate) fn refusal(status: u16, body: &[u8]) -> anyhow::Error {
    let (code, message) = match ErrorBody::from_json(body) {
        Ok(ErrorBody { error }) => (error.code, error.message),
        Err(ErrorBodyError::Malformed {
            code,
            message,
            reason,
        }) => (
            code,
            format!("{message} (its error body breaks docs/api.md: {reason})"),
        ),
        Err(ErrorBodyError::NotAnErrorBody(_)) => (
            format!("http_{status}"),
            String::from_utf8_lossy(&body[..body.len().min(500)]).into_owned(),
        ),
    };
    anyhow!(
        "the witness refused ({status} {}): {}",
        escape(&code),
        escape(&message)
    )
}

/// The refusal to overwrite `out`.
#[must_use]
pub(crate) fn exists(out: &Path) -> anyhow::Error {
    anyhow!(
        "{} exists; give --force to overwrite it, or -o another file",
        out.display()
    )
}

/// Arguments of `tally project`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub command: ProjectCommand,
}

/// The `tally project` subcommands (admin token).
#[derive(Debug, clap::Subcommand)]
pub(crate) enum ProjectCommand {
    /// Create a project and print its first API key (shown once).
    Create {
        /// The project's name (a-z 0-9 . _ -).
        name: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// List the projects.
    List {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Make another API key for a project (shown once), e.g. to rotate keys.
    NewKey {
        /// The project.
        name: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Revoke an API key by its id (the 16 hex digits after `tally_`).
    RevokeKey {
        /// The key id.
        id: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// Runs `tally project …`.
///
/// # Errors
/// Transport errors and refusals (exit 2).
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        ProjectCommand::Create { name, admin } => {
            let key: NewApiKey = admin
                .remote()?
                .post("/v1/projects", &CreateProjectRequest { name: name.clone() })?;
            outln!("project {} created", escape(&key.project))?;
            outln!("API key: {}", escape(&key.api_key))?;
            outln!("(shown once: it is stored only as a hash)")?;
        }
        ProjectCommand::List { admin } => {
            let list: ProjectList = admin.remote()?.get("/v1/projects", &[])?;
            for p in &list.projects {
                outln!(
                    "{}\t{} agents\tcreated {}",
                    escape(&p.name),
                    p.agents,
                    p.created
                )?;
            }
        }
        ProjectCommand::NewKey { name, admin } => {
            let key: NewApiKey = admin
                .remote()?
                .post_empty(&format!("/v1/projects/{name}/api-keys"))?;
            outln!("API key: {}", escape(&key.api_key))?;
            outln!("(shown once: it is stored only as a hash)")?;
        }
        ProjectCommand::RevokeKey { id, admin } => {
            let revoked: ApiKeyRevoked = admin
                .remote()?
                .post_empty(&format!("/v1/api-keys/{id}/revoke"))?;
            outln!("API key {} revoked", escape(&revoked.api_key_id))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
