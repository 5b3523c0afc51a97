"""Apache Airflow provider for Volcano project locks."""
