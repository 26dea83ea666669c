//! OpenAI's Responses API (`/v1/responses`) as vLLM serves it, built on the chat-completions pipeline: a request is
//! converted into a chat request (`convert`), validated and run as chat, and chat's output is rendered as a
//! response object (`render`) or re-told as Responses stream events (`stream`). Finished responses are kept in a
//! bounded in-memory store (`store`) for retrieval and `previous_response_id`. Wire types in `types`.

pub mod convert;
pub mod render;
pub mod store;
pub mod stream;
pub mod types;

#[cfg(test)]
mod tests;
