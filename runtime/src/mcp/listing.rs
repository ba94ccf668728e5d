//! `tools/list`, followed through its pages and bounded: shared by the stdio servers
//! (`client.rs`) and the streamable-HTTP ones (`http.rs`), a leaf so neither imports the
//! other.

use serde_json::Value as Json;

use super::progress::Service;

/// The most `tools/list` pages read from one server.
const MAX_LIST_PAGES: usize = 100;
/// The most tools one server may list.
const MAX_TOOLS: usize = 1000;

/// Every tool the server lists, following `nextCursor`, as JSON.
pub(super) async fn list_tools(service: &Service) -> Result<Vec<Json>, String> {
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_LIST_PAGES {
        let params = cursor
            .take()
            .map(|c| rmcp::model::PaginatedRequestParams::default().with_cursor(Some(c)));
        let page = service
            .peer()
            .list_tools(params)
            .await
            .map_err(|e| format!("`tools/list` failed: {e}"))?;
        let page = serde_json::to_value(&page)
            .map_err(|e| format!("`tools/list` gave an unreadable page: {e}"))?;
        if let Some(Json::Array(listed)) = page.get("tools") {
            if tools.len() + listed.len() > MAX_TOOLS {
                return Err(format!("lists more than {MAX_TOOLS} tools"));
            }
            tools.extend(listed.iter().cloned());
        }
        match page.get("nextCursor").and_then(Json::as_str) {
            Some(next) if !next.is_empty() => cursor = Some(next.to_owned()),
            _ => return Ok(tools),
        }
    }
    Err(format!(
        "`tools/list` gave more than {MAX_LIST_PAGES} pages"
    ))
}
