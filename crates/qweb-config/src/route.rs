//! `[[route]]`: path prefixes and what serves them (static files, a reverse proxy, a
//! redirect); the proxy keys are validated in `proxy.rs`.

use std::path::{Path, PathBuf};

use toml::Spanned;

use super::raw::RawRoute;
use super::{absolute, ConfigError, ProxyConfig, RedirectConfig, RouteRules, Validator};

/// A path prefix and what serves it.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// Matches the path itself and everything below it (`/api` matches `/api` and `/api/x`, not
    /// `/apix`); `/` matches everything.
    pub prefix: String,
    /// Remove the prefix from the path before serving it (a static route then maps
    /// `/prefix/x` to `root/x`, a proxy route forwards `/x`). Off: the whole path is used.
    pub strip_prefix: bool,
    /// What serves the route.
    pub action: RouteAction,
    /// Header edits and `expires` around the handler.
    pub rules: RouteRules,
    /// `cache`: the proxy's responses are cached (`None`: not cached).
    pub cache: Option<super::RouteCache>,
}

/// What serves a route.
#[derive(Debug, Clone)]
// a handful per configuration, built once: the size of the proxy variant costs nothing
#[allow(clippy::large_enum_variant)]
pub enum RouteAction {
    /// Files under a directory.
    Static(StaticConfig),
    /// Upstream HTTP/1.1 servers.
    Proxy(ProxyConfig),
    /// A redirect (`redirect = { to = "https://{host}{uri}", status = 308 }`).
    Redirect(RedirectConfig),
}

/// Static file serving.
#[derive(Debug, Clone)]
pub struct StaticConfig {
    /// The document root.
    pub root: PathBuf,
    /// File served for a directory.
    pub index: String,
    /// Which symlinks in a request's path are followed.
    pub symlinks: Symlinks,
    /// How files are opened beneath the root (not a config key: tests force the fallback).
    pub open_method: OpenMethod,
}

/// Which symlinks a static route follows (`symlinks = "inside_root" | "refuse" | "follow"`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Symlinks {
    /// Symlinks are followed as long as the path stays beneath the root (the kernel's
    /// `RESOLVE_BENEATH`): relative targets that stay inside work, absolute targets are
    /// refused even when they point inside the root, as is every target that leaves it.
    #[default]
    InsideRoot,
    /// No symlink anywhere in the path.
    Refuse,
    /// Any symlink, wherever it points (nginx's `disable_symlinks off`): whoever can create a
    /// symlink under the root can publish any file the server can read.
    Follow,
}

/// How a static route opens files beneath its root.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OpenMethod {
    /// `openat2` with `RESOLVE_BENEATH` when the kernel allows it (probed once per process),
    /// else [`OpenMethod::Walk`].
    #[default]
    Auto,
    /// One `openat(O_NOFOLLOW)` per path component from the root's directory fd, symlinks
    /// resolved by qweb with the same rules (the fallback where `openat2` is unavailable,
    /// e.g. blocked by seccomp).
    Walk,
}

/// The route without a config: `/` serves `./public` when it exists, else the built-in
/// welcome site in `state_dir`.
pub(super) fn default_routes(state_dir: &Path) -> Vec<RouteConfig> {
    let public = PathBuf::from("public");
    let root = if public.is_dir() {
        absolute(&public)
    } else {
        state_dir.join("welcome")
    };
    vec![RouteConfig {
        prefix: "/".into(),
        strip_prefix: false,
        action: RouteAction::Static(StaticConfig {
            root,
            index: "index.html".into(),
            symlinks: Symlinks::default(),
            open_method: OpenMethod::default(),
        }),
        rules: RouteRules::default(),
        cache: None,
    }]
}

impl Validator<'_> {
    /// Validates the `[[route]]` tables, longest prefix first (the default route when there
    /// are none).
    pub(super) fn routes(
        &self,
        raw: &[Spanned<RawRoute>],
        state_dir: &Path,
    ) -> Result<Vec<RouteConfig>, ConfigError> {
        let mut routes: Vec<RouteConfig> = Vec::new();
        for (i, r) in raw.iter().enumerate() {
            let route = self.route(i, r)?;
            if routes.iter().any(|o| o.prefix == route.prefix) {
                return Err(self.err(
                    Some(r.get_ref().prefix.span()),
                    format!("route[{i}].prefix"),
                    format!("prefix `{}` is used by another route", route.prefix),
                ));
            }
            routes.push(route);
        }
        if routes.is_empty() {
            routes = default_routes(state_dir);
        }
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        Ok(routes)
    }

    /// Validates route `i` (also a site's route, from `sites.rs`).
    pub(super) fn route(
        &self,
        i: usize,
        r: &Spanned<RawRoute>,
    ) -> Result<RouteConfig, ConfigError> {
        let rr = r.get_ref();
        let prefix = rr.prefix.get_ref().clone();
        if !prefix.starts_with('/') {
            return Err(self.err(
                Some(rr.prefix.span()),
                format!("route[{i}].prefix"),
                "a prefix starts with `/`",
            ));
        }
        let prefix = if prefix.len() > 1 {
            prefix.trim_end_matches('/').to_owned()
        } else {
            prefix
        };
        let action = match (&rr.root, &rr.upstreams) {
            (None, None) if rr.redirect.is_some() => {
                RouteAction::Redirect(self.route_redirect(i, r)?)
            }
            (_, _) if rr.redirect.is_some() => {
                return Err(self.err(
                    Some(r.span()),
                    format!("route[{i}].redirect"),
                    "a redirect route has neither `root` nor `upstreams`",
                ))
            }
            (Some(_), Some(_)) | (None, None) => {
                return Err(self.err(
                    Some(r.span()),
                    format!("route[{i}]"),
                    "a route has either `root` (static files) or `upstreams` (reverse proxy)",
                ))
            }
            (Some(root), None) => {
                let path = self.path(root.get_ref(), root.span());
                if !path.is_dir() {
                    return Err(self.err(
                        Some(root.span()),
                        format!("route[{i}].root"),
                        format!("{} is not a directory", path.display()),
                    ));
                }
                self.no_proxy_keys(i, rr)?;
                RouteAction::Static(StaticConfig {
                    root: path,
                    index: rr.index.clone().unwrap_or_else(|| "index.html".into()),
                    symlinks: self.symlinks(i, rr)?,
                    open_method: OpenMethod::default(),
                })
            }
            (None, Some(ups)) => RouteAction::Proxy(self.proxy_route(i, rr, ups)?),
        };
        if let (Some(s), RouteAction::Proxy(_)) = (&rr.symlinks, &action) {
            return Err(self.err(
                Some(s.span()),
                format!("route[{i}].symlinks"),
                "`symlinks` is for static routes",
            ));
        }
        if rr.index.is_some() && !matches!(action, RouteAction::Static(_)) {
            return Err(self.err(
                Some(r.span()),
                format!("route[{i}].index"),
                "`index` is for static routes",
            ));
        }
        let rules = self.route_rules(i, r, &action)?;
        let cache = self.route_cache(i, rr.cache.as_ref(), &action)?;
        Ok(RouteConfig {
            prefix,
            strip_prefix: rr.strip_prefix.unwrap_or(false),
            action,
            rules,
            cache,
        })
    }

    /// Validates route `i`'s `symlinks`.
    fn symlinks(&self, i: usize, rr: &RawRoute) -> Result<Symlinks, ConfigError> {
        let Some(s) = &rr.symlinks else {
            return Ok(Symlinks::default());
        };
        match s.get_ref().as_str() {
            "inside_root" => Ok(Symlinks::InsideRoot),
            "refuse" => Ok(Symlinks::Refuse),
            "follow" => Ok(Symlinks::Follow),
            other => Err(self.err(
                Some(s.span()),
                format!("route[{i}].symlinks"),
                format!(
                    "unknown symlinks mode `{other}` (use \"inside_root\", \"refuse\" or \"follow\")"
                ),
            )),
        }
    }
}

impl Validator<'_> {
    /// Site `key`'s `[[site.route]]`s (at least one, no prefix twice), longest prefix first.
    pub(super) fn site_routes(
        &self,
        key: &str,
        site: &Spanned<super::raw::RawSite>,
    ) -> Result<Vec<RouteConfig>, ConfigError> {
        let sr = site.get_ref();
        if sr.routes.is_empty() {
            return Err(self.err(
                Some(site.span()),
                format!("{key}.route"),
                "a site needs at least one [[site.route]]",
            ));
        }
        let mut routes: Vec<RouteConfig> = Vec::new();
        for (i, r) in sr.routes.iter().enumerate() {
            let route = self.route(i, r).map_err(|mut e| {
                // route() names keys `route[i]...`: put them under this site
                if e.key.starts_with("route[") {
                    e.key = format!("{key}.{}", e.key);
                }
                e
            })?;
            if routes.iter().any(|o| o.prefix == route.prefix) {
                return Err(self.err(
                    Some(r.get_ref().prefix.span()),
                    format!("{key}.route[{i}].prefix"),
                    format!(
                        "prefix `{}` is used by another route of this site",
                        route.prefix
                    ),
                ));
            }
            routes.push(route);
        }
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        Ok(routes)
    }
}
