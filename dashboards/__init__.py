"""The Streamlit dashboard (`infertrace dashboard --store DIR`): renders analyzer results only."""
