//! (in progress)
pub struct ChatTemplate;
