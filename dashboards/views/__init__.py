"""One Streamlit page per file."""
