//! How a route of an API is described (method, path, query, bodies): the leaf both the
//! OpenAPI document ([`crate::openapi`]) and the per-capability route lists (such as
//! [`crate::git::GIT_ROUTES`]) build on, so neither imports the other's module for it.

use schemars::gen::SchemaGenerator;
use schemars::schema::Schema;

/// A request or response body.
#[derive(Clone, Copy)]
pub enum Body {
    /// No body.
    Empty,
    /// A JSON value of a wire type.
    Json(fn(&mut SchemaGenerator) -> Schema),
    /// A JSON value of a wire type, or no body at all (its defaults).
    OptionalJson(fn(&mut SchemaGenerator) -> Schema),
    /// One JSON value per line of a wire type.
    Ndjson(fn(&mut SchemaGenerator) -> Schema),
    /// NDJSON of a wire type by default; binary frames ([`crate::frames`]) for a
    /// client whose `Accept` asks for them.
    NdjsonOrFrames(fn(&mut SchemaGenerator) -> Schema),
    /// Raw bytes of the given media type.
    Bytes(&'static str),
    /// The route is a WebSocket: a GET with an upgrade, then frames as its summary says.
    WebSocket,
}

/// A query parameter: name, JSON type, required, description.
pub type Param = (&'static str, &'static str, bool, &'static str);

/// One route of an API.
pub struct Route {
    /// HTTP method, upper case.
    pub method: &'static str,
    /// Path, with `{name}` placeholders.
    pub path: &'static str,
    /// One line on what it does.
    pub summary: &'static str,
    /// Whether the token header is required.
    pub auth: bool,
    /// Query parameters.
    pub query: &'static [Param],
    /// Request body.
    pub request: Body,
    /// Body of the success response.
    pub response: Body,
}
